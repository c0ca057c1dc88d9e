#include "tests/cli/cli_support.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace flowstate::testing {

std::string cli_path() { return FLOWSTATE_CLI; }
std::string source_dir() { return FLOWSTATE_SOURCE_DIR; }

namespace {

/// The processes of session `sid` that have not died (zombies have), from /proc.
std::vector<pid_t> live_members(pid_t sid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    const std::string stat = read_file(it->path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;  // gone meanwhile
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    pid_t ppid = 0, pgrp = 0, session = 0;
    if (!(rest >> state >> ppid >> pgrp >> session)) continue;
    if (session == sid && state != 'Z' && state != 'X') out.push_back(std::stoi(name));
  }
  return out;
}

}  // namespace

CliProcess::CliProcess(const std::vector<std::string>& args, const std::string& cwd,
                       const std::string& program, bool own_session) {
  static std::atomic<int> counter{0};
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
  out_path_ = cwd + "/.cli-out-" + tag;
  err_path_ = cwd + "/.cli-err-" + tag;
  // Everything the child needs is prepared before fork: between fork and exec it only makes
  // async-signal-safe calls.
  std::vector<std::string> argv_s{program.empty() ? cli_path() : program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || err < 0 || in < 0) throw std::runtime_error("cannot open output files");
  pid_ = ::fork();
  if (pid_ == 0) {
    if (own_session && ::setsid() < 0) ::_exit(124);
    if (::chdir(cwd.c_str()) != 0) ::_exit(125);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out);
  ::close(err);
  ::close(in);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (own_session) session_ = pid_;
}

CliProcess::~CliProcess() {
  if (session_ > 0) kill_session();
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ::unlink(out_path_.c_str());
  ::unlink(err_path_.c_str());
}

void CliProcess::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool CliProcess::exited() const {
  if (pid_ <= 0) return true;
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pid_;
}

int CliProcess::kill_session() {
  if (session_ <= 0) return 0;
  std::set<pid_t> killed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    const std::vector<pid_t> alive = live_members(session_);
    if (alive.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << alive.size() << " processes of session " << session_
                    << " outlived SIGKILL by 30 s";
      break;
    }
    for (pid_t p : alive)
      if (::kill(p, SIGKILL) == 0) killed.insert(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return static_cast<int>(killed.size());
}

CliResult CliProcess::wait(double timeout_s) {
  CliResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    pid_t p = ::waitpid(pid_, &status, WNOHANG);
    if (p == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "flowstate did not finish within " << timeout_s << " s; killed";
      if (session_ > 0)
        kill_session();
      else
        ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path_);
  r.err = read_file(err_path_);
  return r;
}

CliResult run_cli(const std::vector<std::string>& args, const std::string& cwd) {
  CliProcess p(args, cwd);
  return p.wait();
}

CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::string& cwd) {
  CliProcess p(args, cwd, program);
  return p.wait();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<std::string> by_step(const std::vector<std::string>& lines) {
  std::map<std::uint64_t, std::string> m;
  for (const auto& l : lines) {
    const std::uint64_t step = std::stoull(l.substr(0, l.find(' ')));
    auto [it, inserted] = m.emplace(step, l);
    EXPECT_TRUE(inserted || it->second == l) << "step " << step << " differs: " << l;
  }
  std::vector<std::string> out;
  for (auto& [s, l] : m) out.push_back(l);
  return out;
}

}  // namespace flowstate::testing

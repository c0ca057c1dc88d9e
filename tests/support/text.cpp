#include "tests/support/text.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "flowstate/nodes/sources/lines.h"

namespace flowstate::testing {

void write_text_jsonl(const std::string& path, std::uint64_t docs, std::uint64_t words,
                      std::uint64_t seed) {
  std::string text;
  for (std::uint64_t i = 0; i < docs; ++i) append_jsonl_text(text, synthetic_text(seed, i, words));
  std::ofstream(path, std::ios::binary) << text;
}

std::string train_sentencepiece(const std::string& dir, const std::string& name,
                                std::uint64_t vocab, std::uint64_t docs, std::uint64_t words,
                                const std::string& extra) {
  const std::string corpus = dir + "/" + name + ".corpus.txt";
  {
    std::ofstream out(corpus, std::ios::binary);
    for (std::uint64_t i = 0; i < docs; ++i) {
      std::string doc = synthetic_text(7, i, words);
      std::replace(doc.begin(), doc.end(), '\n', ' ');  // spm_train reads a sentence per line
      out << doc << '\n';
    }
  }
  const std::string prefix = dir + "/" + name;
  const std::string cmd = "spm_train --input='" + corpus + "' --model_prefix='" + prefix +
                          "' --vocab_size=" + std::to_string(vocab) +
                          " --minloglevel=2 --num_threads=1 " + extra + " > '" + prefix +
                          ".log' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream log(prefix + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << "spm_train failed (" << rc << "; Debian package 'sentencepiece'): " << cmd
                  << "\n"
                  << text;
    return "";
  }
  return prefix + ".model";
}

}  // namespace flowstate::testing

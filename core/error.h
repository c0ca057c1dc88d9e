// Errors are exceptions (a TBB graph cancels and rethrows). Every error names where it
// happened: a ConfigError carries the key path (and file:line:column when it came from a
// file), a DataError the file and byte offset, a CheckpointError the file and the reason.
//
//   try { loader.next(); } catch (const flowstate::DataError& e) { log(e.file(), e.offset()); }
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace flowstate {

/// Base of every error flowstate throws. `node()` is the name of the pipeline node that
/// failed, empty when the error did not come from a running node.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  const std::string& node() const { return node_; }
  /// Returns a copy of this error, of the same dynamic type, whose message is prefixed with
  /// the node's name. Used by the graph to say which node failed.
  virtual std::exception_ptr with_node(const std::string& node) const;

 protected:
  std::string node_;
};

/// A pipeline description, option or YAML value is wrong. `key()` is the key path
/// (`nodes[2].shuffle.size`).
class ConfigError : public Error {
 public:
  ConfigError(std::string key, const std::string& message);
  const std::string& key() const { return key_; }
  std::exception_ptr with_node(const std::string& node) const override;

 private:
  std::string key_;
};

/// Input data is missing, unreadable or malformed. `file()` and `offset()` say where;
/// offset is kNoOffset when the problem is the file as a whole.
class DataError : public Error {
 public:
  static constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};
  DataError(std::string file, std::uint64_t offset, const std::string& message);
  const std::string& file() const { return file_; }
  std::uint64_t offset() const { return offset_; }
  std::exception_ptr with_node(const std::string& node) const override;

 private:
  std::string file_;
  std::uint64_t offset_;
};

/// A checkpoint cannot be written, read or applied. `file()` names the file involved
/// (may be a directory), and the message says why.
class CheckpointError : public Error {
 public:
  CheckpointError(std::string file, const std::string& reason);
  const std::string& file() const { return file_; }
  std::exception_ptr with_node(const std::string& node) const override;

 private:
  std::string file_;
};

/// Rethrows `e`, an exception a node threw while it worked on the data (a pull, a map), prefixed
/// with the node's name: a flowstate::Error keeps its type (one already naming a node is
/// rethrown as it is); any other exception, of any type (std::bad_alloc, `throw 42`), becomes a
/// DataError "node 'NAME': what()" ("node 'NAME': threw an exception of type int" when it is
/// no std::exception), so the command exits with the data status, never an abort.
[[noreturn]] void rethrow_with_node(std::exception_ptr e, const std::string& node);

/// The same for an exception a node threw while it loaded its state (SpineNode::restore): a
/// CheckpointError (what a restore throws on a state it refuses, saying why) is rethrown as it
/// is; anything else, of any type, becomes a CheckpointError on `where` (the state file)
/// "node 'NAME': its restore failed: what()".
[[noreturn]] void rethrow_restore_with_node(std::exception_ptr e, const std::string& node,
                                            const std::string& where);

/// What the exception being handled says: what() of a std::exception, else "an exception of
/// type T" (the demangled type of `throw 42`: int). Call it inside a catch block only.
std::string current_exception_text();

}  // namespace flowstate

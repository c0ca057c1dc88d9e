#include "flowstate/core/error.h"

namespace flowstate {
namespace {

std::string node_prefix(const std::string& node, const char* what) {
  return "node '" + node + "': " + what;
}

}  // namespace

std::exception_ptr Error::with_node(const std::string& node) const {
  Error copy(node_prefix(node, what()));
  copy.node_ = node;
  return std::make_exception_ptr(copy);
}

ConfigError::ConfigError(std::string key, const std::string& message)
    : Error(message), key_(std::move(key)) {}

std::exception_ptr ConfigError::with_node(const std::string& node) const {
  ConfigError copy(key_, node_prefix(node, what()));
  copy.node_ = node;
  return std::make_exception_ptr(copy);
}

DataError::DataError(std::string file, std::uint64_t offset, const std::string& message)
    : Error(message), file_(std::move(file)), offset_(offset) {}

std::exception_ptr DataError::with_node(const std::string& node) const {
  DataError copy(file_, offset_, node_prefix(node, what()));
  copy.node_ = node;
  return std::make_exception_ptr(copy);
}

CheckpointError::CheckpointError(std::string file, const std::string& reason)
    : Error(reason), file_(std::move(file)) {}

std::exception_ptr CheckpointError::with_node(const std::string& node) const {
  CheckpointError copy(file_, node_prefix(node, what()));
  copy.node_ = node;
  return std::make_exception_ptr(copy);
}

void rethrow_with_node(std::exception_ptr e, const std::string& node) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (!err.node().empty()) throw;  // already attributed by an inner node
    std::rethrow_exception(err.with_node(node));
  } catch (const std::exception& other) {
    std::rethrow_exception(Error(other.what()).with_node(node));
  } catch (...) {
    std::rethrow_exception(Error("unknown exception").with_node(node));
  }
}

}  // namespace flowstate

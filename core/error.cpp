#include "flowstate/core/error.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

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

std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    if (type == nullptr) return "an exception of unknown type";
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(
        abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), std::free);
    return std::string("threw an exception of type ") +
           (status == 0 && name ? name.get() : type->name());
  }
}

void rethrow_with_node(std::exception_ptr e, const std::string& node) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (!err.node().empty()) throw;  // already attributed by an inner node
    std::rethrow_exception(err.with_node(node));
  } catch (...) {
    std::rethrow_exception(
        DataError("", DataError::kNoOffset, current_exception_text()).with_node(node));
  }
}

void rethrow_restore_with_node(std::exception_ptr e, const std::string& node,
                               const std::string& where) {
  try {
    std::rethrow_exception(e);
  } catch (const CheckpointError&) {
    throw;  // what a restore throws on a state it refuses (SpineNode::restore): it says why
  } catch (...) {
    std::rethrow_exception(
        CheckpointError(where, "its restore failed: " + current_exception_text()).with_node(node));
  }
}

}  // namespace flowstate

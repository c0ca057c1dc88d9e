// A node's canonical description: its type and parameters in a fixed order, as text. The
// basis of the pipeline fingerprint, `flowstate validate` and checkpoint mismatch messages.
// Every node derives its description from its options table (nodes/options.h).
#pragma once

#include <string>
#include <vector>

namespace flowstate {

/// One parameter of a node's canonical description. `free` parameters (worker counts,
/// prefetch depth, device) do not change the output and are left out of the fingerprint.
/// `data` parameters (a mix's weights and inputs) are fingerprinted, but a resume that opts
/// into data changes (LoaderOptions::on_data_change) may continue when only they differ: the
/// node's SpineNode::restore_changed carries its state over to the new values.
struct DescribedParam {
  std::string key;
  std::string value;  ///< canonical text form
  bool free = false;
  bool data = false;
};

/// A node's type and parameters, in a canonical order.
struct NodeDescription {
  std::string type;
  std::vector<DescribedParam> params;
  /// "type(k=v, ...)"; free parameters only when `with_free`.
  std::string to_string(bool with_free = true) const;
};

/// The shortest text that reads back as `v` ("0.5", "1e-08"): canonical numbers in
/// descriptions.
std::string format_double(double v);

/// "a,b,c": a list parameter's canonical text in a description.
std::string join_list(const std::vector<std::string>& items);

}  // namespace flowstate

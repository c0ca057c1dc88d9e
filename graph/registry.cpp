#include "graph/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "graph/transforms.h"
#include "graph/yaml.h"

namespace flowstate {

std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::kBool:
      return "a boolean (true or false)";
    case ParamType::kUInt:
      return "an unsigned integer";
    case ParamType::kInt:
      return "an integer";
    case ParamType::kFloat:
      return "a number";
    case ParamType::kString:
      return "a string";
    case ParamType::kStringList:
      return "a string or a list of strings";
    case ParamType::kIntList:
      return "an integer or a list of integers";
  }
  return "a value";
}

namespace {

std::string format_bound(double v) {
  if (std::abs(v) < 9e15 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
  return format_double(v);
}

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

}  // namespace

// Numbers compared with double bounds: exact for every bound a schema declares.
std::string check_number(const ParamSchema& p, double v, const std::string& text) {
  if (p.min && v < *p.min) {
    if (p.max)
      return text + " is out of range (must be between " + format_bound(*p.min) + " and " +
             format_bound(*p.max) + ")";
    return text + " is out of range (must be at least " + format_bound(*p.min) + ")";
  }
  if (p.max && v > *p.max) {
    if (p.min)
      return text + " is out of range (must be between " + format_bound(*p.min) + " and " +
             format_bound(*p.max) + ")";
    return text + " is out of range (must be at most " + format_bound(*p.max) + ")";
  }
  return "";
}

std::string format_param(const ParamValue& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(std::uint64_t v) const { return std::to_string(v); }
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_double(v); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<std::string>& v) const { return "[" + join(v) + "]"; }
    std::string operator()(const std::vector<std::int64_t>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

std::string check_param(const ParamSchema& p, const ParamValue& value) {
  std::string problem;
  if (const auto* u = std::get_if<std::uint64_t>(&value)) {
    problem = check_number(p, static_cast<double>(*u), std::to_string(*u));
  } else if (const auto* i = std::get_if<std::int64_t>(&value)) {
    problem = check_number(p, static_cast<double>(*i), std::to_string(*i));
  } else if (const auto* d = std::get_if<double>(&value)) {
    problem = check_number(p, *d, format_double(*d));
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    if (!p.choices.empty() && std::find(p.choices.begin(), p.choices.end(), *s) == p.choices.end())
      problem = "'" + *s + "' is not one of: " + join(p.choices);
  } else if (const auto* l = std::get_if<std::vector<std::int64_t>>(&value)) {
    for (auto x : *l) {
      problem = check_number(p, static_cast<double>(x), std::to_string(x));
      if (!problem.empty()) break;
    }
  }
  if (problem.empty() && p.check) problem = p.check(value);
  return problem;
}

// ---- Params ----

Params::Params(std::string key, std::vector<std::pair<std::string, ParamValue>> values,
               std::vector<std::pair<std::string, std::string>> where)
    : key_(std::move(key)), values_(std::move(values)), where_(std::move(where)) {}

const ParamValue* Params::find(std::string_view name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return &v;
  return nullptr;
}

bool Params::given(std::string_view name) const {
  for (const auto& [n, w] : where_)
    if (n == name) return true;
  return false;
}

template <class T>
const T& Params::get(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr)
    throw std::logic_error("parameter '" + std::string(name) + "' of '" + key_ + "' is not set");
  const T* t = std::get_if<T>(v);
  if (t == nullptr)
    throw std::logic_error("parameter '" + std::string(name) + "' of '" + key_ +
                           "' has another type than the node reads");
  return *t;
}

template const bool& Params::get<bool>(std::string_view) const;
template const std::uint64_t& Params::get<std::uint64_t>(std::string_view) const;
template const std::int64_t& Params::get<std::int64_t>(std::string_view) const;
template const double& Params::get<double>(std::string_view) const;
template const std::string& Params::get<std::string>(std::string_view) const;
template const std::vector<std::string>& Params::get<std::vector<std::string>>(
    std::string_view) const;
template const std::vector<std::int64_t>& Params::get<std::vector<std::int64_t>>(
    std::string_view) const;

std::optional<std::uint64_t> Params::optional_uint(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return uint(name);
}

std::string Params::key(std::string_view param) const {
  if (param.empty()) return key_;
  return key_.empty() ? std::string(param) : key_ + "." + std::string(param);
}

std::string Params::where(std::string_view param) const {
  for (const auto& [n, w] : where_)
    if (n == param) return w;
  for (const auto& [n, w] : where_)
    if (n.empty()) return w;
  return "";
}

std::vector<DescribedParam> Params::describe(const std::vector<ParamSchema>& schema) const {
  std::vector<DescribedParam> out;
  for (const auto& p : schema) {
    if (const ParamValue* v = find(p.name)) out.push_back({p.name, format_param(*v), p.free});
  }
  return out;
}

// ---- Registry ----

void Registry::add(NodeSchema schema) {
  if (schema.type.empty()) throw std::invalid_argument("Registry::add: a node type needs a name");
  if (find(schema.type) != nullptr)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' is already registered");
  if (!schema.add)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' has no build function");
  nodes_.push_back(std::move(schema));
}

const NodeSchema* Registry::find(std::string_view type) const {
  for (const auto& n : nodes_)
    if (n.type == type) return &n;
  return nullptr;
}

std::vector<std::string> Registry::names(bool sources) const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    if (n.source == sources) out.push_back(n.type);
  return out;
}

Registry Registry::with_builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

const Registry& Registry::builtin() {
  static const Registry r = with_builtins();
  return r;
}

// ---- built-in nodes ----

namespace {

std::string check_device(const ParamValue& v) {
  const auto& s = std::get<std::string>(v);
  if (s == "auto" || s == "cpu") return "";
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 &&
      std::all_of(s.begin() + 5, s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  return "'" + s + "' is not a device (use auto, cpu or cuda:N)";
}

std::string check_not_empty(const ParamValue& v) {
  if (std::get<std::vector<std::string>>(v).empty()) return "must name at least one file or glob";
  for (const auto& s : std::get<std::vector<std::string>>(v))
    if (s.empty()) return "must not contain an empty path";
  return "";
}

ParamSchema paths_param() {
  return {.name = "paths",
          .type = ParamType::kStringList,
          .doc = "files or globs, each glob's matches in sorted order; relative to the YAML file",
          .required = true,
          .check = check_not_empty};
}

/// Adds a file source. The description (and so the fingerprint) holds the paths as written,
/// so a project directory can move without invalidating its checkpoints; the files open
/// relative to the YAML file.
template <class Source, class Options>
void add_file_source(NodeContext& ctx, Options written) {
  Options resolved = written;
  for (auto& path : resolved.paths) {
    std::filesystem::path f(path);
    if (f.is_relative() && !ctx.base_dir.empty()) path = (ctx.base_dir / f).string();
  }
  ctx.builder.source(written.describe(), source_factory<Source>(std::move(resolved)));
}

NodeSchema records_schema() {
  NodeSchema n;
  n.type = "records";
  n.doc = "fixed-size records in shard files (e.g. token .bin files), memory-mapped";
  n.source = true;
  n.params = {
      paths_param(),
      {.name = "record_bytes",
       .type = ParamType::kUInt,
       .doc = "bytes per record",
       .required = true,
       .min = 1},
      {.name = "field",
       .type = ParamType::kString,
       .default_value = std::string("data"),
       .doc = "name of the uint8 [record_bytes] field of each sample"},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    add_file_source<RecordsSource>(
        ctx, RecordsOptions{.paths = p.strings("paths"),
                            .record_bytes = static_cast<std::size_t>(p.uint("record_bytes")),
                            .field = p.string("field")});
  };
  return n;
}

NodeSchema lines_schema() {
  NodeSchema n;
  n.type = "lines";
  n.doc = "text or JSON Lines shards; a byte-offset index is cached beside each file";
  n.source = true;
  n.params = {
      paths_param(),
      {.name = "format",
       .type = ParamType::kString,
       .default_value = std::string("text"),
       .doc = "text (the line's bytes) or jsonl (a JSON value per line)",
       .choices = {"text", "jsonl"}},
      {.name = "field",
       .type = ParamType::kString,
       .default_value = std::string("text"),
       .doc = "the uint8 field holding the line (text, or jsonl without json_fields)"},
      {.name = "skip_empty",
       .type = ParamType::kBool,
       .default_value = false,
       .doc = "empty lines are not records"},
      {.name = "json_fields",
       .type = ParamType::kStringList,
       .doc = "jsonl: top-level keys read into fields of the same name",
       .default_doc = "none: the whole line in `field`"},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    LinesOptions o{.paths = p.strings("paths"),
                   .format = parse_lines_format(p.string("format")),
                   .field = p.string("field"),
                   .skip_empty = p.boolean("skip_empty")};
    if (p.has("json_fields")) o.json_fields = p.strings("json_fields");
    add_file_source<LinesSource>(ctx, std::move(o));
  };
  return n;
}

NodeSchema tar_schema() {
  NodeSchema n;
  n.type = "tar";
  n.doc = "WebDataset-style tar shards: members grouped by key into samples, fields by extension";
  n.source = true;
  n.params = {
      paths_param(),
      {.name = "fields",
       .type = ParamType::kStringList,
       .doc = "the extensions read into fields",
       .default_doc = "every extension seen"},
      {.name = "on_missing",
       .type = ParamType::kString,
       .default_value = std::string("error"),
       .doc = "a sample lacking one of `fields`: error (when the source opens) or skip",
       .choices = {"error", "skip"}},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    TarOptions o{.paths = p.strings("paths"),
                 .on_missing = parse_missing_field(p.string("on_missing"))};
    if (p.has("fields")) o.fields = p.strings("fields");
    add_file_source<TarSource>(ctx, std::move(o));
  };
  return n;
}

NodeSchema shard_schema() {
  NodeSchema n;
  n.type = "shard";
  n.doc = "splits the records across ranks; every record goes to exactly one rank per epoch";
  n.params = {
      {.name = "rank",
       .type = ParamType::kUInt,
       .doc = "this process's rank, < world",
       .default_doc = "RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID, else 0"},
      {.name = "world",
       .type = ParamType::kUInt,
       .doc = "number of ranks",
       .min = 1,
       .default_doc = "WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS, else 1"},
      {.name = "mode",
       .type = ParamType::kString,
       .default_value = std::string("interleave"),
       .doc = "interleave (rank r gets r, r+world, ...) or contiguous (the r-th range)",
       .choices = {"interleave", "contiguous"}},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    ShardOptions o;
    o.rank = p.optional_uint("rank");
    o.world = p.optional_uint("world");
    o.mode = parse_shard_mode(p.string("mode"));
    ctx.builder.shard(o);
  };
  return n;
}

NodeSchema shuffle_schema() {
  NodeSchema n;
  n.type = "shuffle";
  n.doc = "reorders the records, differently every epoch";
  n.params = {
      {.name = "mode",
       .type = ParamType::kString,
       .default_value = std::string("global"),
       .doc = "global (a perfect per-epoch permutation) or buffer (a seeded shuffle buffer)",
       .choices = {"global", "buffer"}},
      {.name = "size",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{16384},
       .doc = "buffer mode: slots in the shuffle buffer",
       .min = 1},
      {.name = "seed",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "mixed with the pipeline seed; change it to get another order"},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    ShuffleOptions o;
    o.mode = parse_shuffle_mode(p.string("mode"));
    if (o.mode == ShuffleMode::kGlobal && p.given("size"))
      throw ConfigError("size", "size applies only to mode: buffer (this shuffle is global)");
    o.size = p.uint("size");
    o.seed = p.uint("seed");
    ctx.builder.shuffle(o);
  };
  return n;
}

NodeSchema map_schema() {
  NodeSchema n;
  n.type = "map";
  n.doc = "applies a named transform to every sample (before batch) or batch (after it)";
  n.params = {
      {.name = "fn",
       .type = ParamType::kString,
       .doc = "the transform (see the transforms below); its parameters go beside fn",
       .required = true},
      {.name = "workers",
       .type = ParamType::kUInt,
       .doc = "parallel workers assembling batches",
       .min = 1,
       .max = 1024,
       .free = true,
       .default_doc = "the pipeline's workers"},
  };
  n.dispatch = "fn";
  n.extra_params = [](const TransformRegistry& t,
                      const std::string& fn) -> const std::vector<ParamSchema>* {
    const TransformSchema* s = t.find(fn);
    return s != nullptr ? &s->params : nullptr;
  };
  n.dispatch_choices = [](const TransformRegistry& t) { return t.names(); };
  n.node_name = [](const Params& p) { return p.string("fn"); };  // MapOptions::name
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    const std::string& fn = p.string("fn");
    const TransformSchema* t = ctx.transforms.find(fn);
    if (t == nullptr) throw ConfigError("fn", "unknown transform '" + fn + "'");
    MapOptions o;
    o.name = fn;
    if (auto w = p.optional_uint("workers")) o.workers = static_cast<int>(*w);
    o.params = p.describe(t->params);
    if (ctx.after_batch) {
      if (!t->make_batch)
        throw ConfigError(
            "fn", "transform '" + fn + "' works on single samples; put this map before batch");
      ctx.builder.map_batch(t->make_batch(p), std::move(o));
    } else {
      ctx.builder.map(t->make_sample(p), std::move(o));
    }
  };
  return n;
}

NodeSchema batch_schema() {
  NodeSchema n;
  n.type = "batch";
  n.doc = "groups samples into batches, one contiguous [B, ...] tensor per field";
  n.params = {
      {.name = "size",
       .type = ParamType::kUInt,
       .doc = "samples per batch",
       .required = true,
       .min = 1},
      {.name = "drop_last",
       .type = ParamType::kBool,
       .default_value = false,
       .doc = "drop a short last batch of each epoch"},
      {.name = "collate",
       .type = ParamType::kString,
       .default_value = std::string("stack"),
       .doc = "stack (equal shapes), pad ([B, max_len, ...] + <field>_length) or ragged "
              "(values + <field>_offsets)",
       .choices = {"stack", "pad", "ragged"}},
      {.name = "fields",
       .type = ParamType::kStringList,
       .doc = "fields that pad / ragged apply to",
       .default_doc = "every field of rank >= 1"},
      {.name = "pad_value",
       .type = ParamType::kFloat,
       .default_value = 0.0,
       .doc = "pad: the value of padding elements"},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    BatchOptions o{.size = p.uint("size"), .drop_last = p.boolean("drop_last")};
    const std::string& mode = p.string("collate");
    o.collate = mode == "pad"      ? CollateMode::kPad
                : mode == "ragged" ? CollateMode::kRagged
                                   : CollateMode::kStack;
    if (o.collate == CollateMode::kStack && (p.given("fields") || p.given("pad_value")))
      throw ConfigError(p.given("fields") ? "fields" : "pad_value",
                        "fields and pad_value apply to collate: pad or ragged");
    if (p.has("fields")) o.fields = p.strings("fields");
    o.pad_value = p.real("pad_value");
    ctx.builder.batch(std::move(o));
  };
  return n;
}

/// A 1-D view of a field's values as doubles (the first element of a scalar).
double first_value(const Tensor& t, const std::string& field) {
  if (t.numel() == 0) throw DataError("", DataError::kNoOffset, "field '" + field + "' is empty");
  return visit_dtype(t.dtype(), [&]<class T>() {
    T v;
    std::memcpy(&v, t.data(), sizeof(T));
    return static_cast<double>(v);
  });
}

const std::vector<ParamSchema>& filter_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "fn",
       .type = ParamType::kString,
       .doc = "length: the field's first dimension in [min, max]; value: its first element in "
              "[min, max]; keep_fraction: a seeded coin per sample and epoch",
       .required = true,
       .choices = {"length", "value", "keep_fraction"}},
      {.name = "field", .type = ParamType::kString, .doc = "the field (length, value)"},
      {.name = "min", .type = ParamType::kFloat, .doc = "inclusive lower bound (length, value)"},
      {.name = "max", .type = ParamType::kFloat, .doc = "inclusive upper bound (length, value)"},
      {.name = "fraction",
       .type = ParamType::kFloat,
       .doc = "keep_fraction: the share of samples kept",
       .min = 0,
       .max = 1},
  };
  return params;
}

NodeSchema filter_schema() {
  NodeSchema n;
  n.type = "filter";
  n.doc = "drops samples a named predicate rejects; batches stay full and resume stays exact";
  n.params = filter_params();
  n.node_name = [](const Params& p) { return p.string("fn"); };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    const std::string fn = p.string("fn");
    FilterOptions o{.name = fn, .params = p.describe(filter_params())};
    std::erase_if(o.params, [](const DescribedParam& d) { return d.key == "fn"; });
    if (fn == "keep_fraction") {
      if (!p.has("fraction")) throw ConfigError("fraction", "keep_fraction needs a fraction");
      const double f = p.real("fraction");
      ctx.builder.filter(
          [f](const Sample&, MapContext& c) {
            return static_cast<double>(c.rng() >> 11) * 0x1p-53 < f;
          },
          std::move(o));
      return;
    }
    if (!p.has("field")) throw ConfigError("field", fn + " needs a field");
    if (!p.has("min") && !p.has("max")) throw ConfigError("min", fn + " needs min or max");
    const std::string field = p.string("field");
    const double lo = p.has("min") ? p.real("min") : -HUGE_VAL;
    const double hi = p.has("max") ? p.real("max") : HUGE_VAL;
    const FieldId id = field_id(field);
    const bool length = fn == "length";
    ctx.builder.filter(
        [=](const Sample& s, MapContext&) {
          const Tensor* t = s.find(id);
          if (t == nullptr)
            throw DataError("", DataError::kNoOffset,
                            "record " + s.ref.to_string() + " has no field '" + field + "'");
          const double v = length
                               ? (t->shape().rank() == 0 ? 1.0 : static_cast<double>(t->shape()[0]))
                               : first_value(*t, field);
          return v >= lo && v <= hi;
        },
        std::move(o));
  };
  return n;
}

NodeSchema pack_schema() {
  NodeSchema n;
  n.type = "pack";
  n.doc = "concatenates token sequences and cuts rows of exactly `length` tokens";
  n.params = {
      {.name = "length",
       .type = ParamType::kUInt,
       .doc = "tokens per row",
       .required = true,
       .min = 1},
      {.name = "field",
       .type = ParamType::kString,
       .default_value = std::string("tokens"),
       .doc = "the 1-D integer token field"},
      {.name = "separator",
       .type = ParamType::kInt,
       .default_value = std::int64_t{-1},
       .doc = "token appended after every sequence; -1: none"},
      {.name = "drop_remainder",
       .type = ParamType::kBool,
       .default_value = true,
       .doc = "drop the epoch's last partial row (false: pad it)"},
      {.name = "pad",
       .type = ParamType::kInt,
       .default_value = std::int64_t{0},
       .doc = "the token that pads a partial last row"},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    ctx.builder.pack({.length = p.uint("length"),
                      .field = p.string("field"),
                      .separator = p.integer("separator"),
                      .drop_remainder = p.boolean("drop_remainder"),
                      .pad = p.integer("pad")});
  };
  return n;
}

NodeSchema mix_schema() {
  NodeSchema n;
  n.type = "mix";
  n.doc = "samples from several input pipelines (YAML files without batch) by weight";
  n.source = true;
  n.params = {
      {.name = "inputs",
       .type = ParamType::kStringList,
       .doc = "input pipeline files (source, shard, shuffle, filter, maps); relative to this file",
       .required = true,
       .check = check_not_empty},
      {.name = "weights",
       .type = ParamType::kStringList,
       .doc = "one positive number per input",
       .required = true},
      {.name = "stop",
       .type = ParamType::kString,
       .default_value = std::string("first_exhausted"),
       .doc = "first_exhausted, all_exhausted or cycle: when an epoch of the mix ends",
       .choices = {"first_exhausted", "all_exhausted", "cycle"}},
  };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    MixOptions o;
    const auto& ws = p.strings("weights");
    for (std::size_t i = 0; i < ws.size(); ++i) {
      double w = 0;
      auto [end, ec] = std::from_chars(ws[i].data(), ws[i].data() + ws[i].size(), w);
      if (ec != std::errc() || end != ws[i].data() + ws[i].size() || !(w > 0) || !std::isfinite(w))
        throw ConfigError("weights", "weights[" + std::to_string(i) + "]: '" + ws[i] +
                                         "' is not a positive number");
      o.weights.push_back(w);
    }
    const std::string& stop = p.string("stop");
    o.stop = stop == "cycle"           ? MixStop::kCycle
             : stop == "all_exhausted" ? MixStop::kAllExhausted
                                       : MixStop::kFirstExhausted;
    std::vector<Pipeline> inputs;
    for (const auto& path : p.strings("inputs")) {
      std::filesystem::path f(path);
      if (f.is_relative() && !ctx.base_dir.empty()) f = ctx.base_dir / f;
      inputs.push_back(from_yaml_file(f.string(), {.mix_input = true}));
    }
    ctx.builder.mix(std::move(inputs), std::move(o));
  };
  return n;
}

NodeSchema prefetch_schema() {
  NodeSchema n;
  n.type = "prefetch";
  n.doc = "how many batches may be prepared ahead of the consumer";
  n.params = {{.name = "depth",
               .type = ParamType::kUInt,
               .default_value = std::uint64_t{4},
               .doc = "batches prepared ahead",
               .min = 1,
               .max = 4096,
               .free = true}};
  n.add = [](NodeContext& ctx) {
    ctx.builder.prefetch({.depth = static_cast<std::size_t>(ctx.params.uint("depth"))});
  };
  return n;
}

NodeSchema device_copy_schema() {
  NodeSchema n;
  n.type = "device_copy";
  n.doc = "moves every batch to the accelerator (host memory without one, for auto)";
  n.params = {{.name = "device",
               .type = ParamType::kString,
               .default_value = std::string("auto"),
               .doc = "auto (the first CUDA device, else host), cpu, or cuda:N",
               .free = true,
               .check = check_device}};
  n.add = [](NodeContext& ctx) {
    ctx.builder.device_copy({.device = ctx.params.string("device")});
  };
  return n;
}

}  // namespace

void register_builtin_nodes(Registry& registry) {
  registry.add(records_schema());
  registry.add(lines_schema());
  registry.add(tar_schema());
  registry.add(shard_schema());
  registry.add(shuffle_schema());
  registry.add(mix_schema());
  registry.add(map_schema());
  registry.add(filter_schema());
  registry.add(pack_schema());
  registry.add(batch_schema());
  registry.add(prefetch_schema());
  registry.add(device_copy_schema());
}

const std::vector<ParamSchema>& pipeline_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "seed",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "the pipeline seed; shuffles and map generators derive from it"},
      {.name = "workers",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{2},
       .doc = "parallel workers reading, mapping and collating batches",
       .min = 1,
       .max = 1024,
       .free = true},
      {.name = "epochs",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{1},
       .doc = "epochs to run; 0 runs until stopped"},
  };
  return params;
}

const std::vector<ParamSchema>& checkpoint_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "dir",
       .type = ParamType::kString,
       .doc = "directory of the step-N checkpoints; relative to the YAML file",
       .required = true,
       .check = [](const ParamValue& v) -> std::string {
         return std::get<std::string>(v).empty() ? "must not be empty" : "";
       }},
      {.name = "every_steps",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "write a checkpoint after each batch whose (step + 1) is a multiple; 0: only at "
              "the end of a run and on SIGTERM/SIGINT"},
      {.name = "keep",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "newest checkpoints to keep; 0 keeps all"},
  };
  return params;
}

std::string describe_params(const std::vector<ParamSchema>& params, std::string_view indent) {
  std::string out;
  for (const auto& p : params) {
    std::string line = std::string(indent) + p.name + " (" + std::string(param_type_name(p.type));
    if (p.required) {
      line += ", required";
    } else if (p.default_value) {
      line += ", default " + format_param(*p.default_value);
    } else if (!p.default_doc.empty()) {
      line += ", default: " + p.default_doc;
    } else {
      line += ", optional";
    }
    if (p.min && p.max)
      line += ", " + format_bound(*p.min) + ".." + format_bound(*p.max);
    else if (p.min)
      line += ", >= " + format_bound(*p.min);
    else if (p.max)
      line += ", <= " + format_bound(*p.max);
    if (!p.choices.empty()) line += ", one of: " + join(p.choices);
    if (p.free) line += ", free";
    line += "): " + p.doc + "\n";
    out += line;
  }
  return out;
}

}  // namespace flowstate

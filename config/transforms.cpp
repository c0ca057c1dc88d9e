#include "flowstate/config/transforms.h"

#include <functional>

#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "flowstate/core/dtype.h"
#include "flowstate/core/rng.h"
#include "flowstate/nodes/image_transforms.h"

namespace flowstate {

// ---- registry ----

namespace {

/// The checks add() makes of a transform or predicate `s` going into `list`: a name not taken,
/// a function, no parameter named after one of its node's own (`reserved`).
template <class Schema>
void check_new(const char* what, const Schema& s, bool has_fn, const std::vector<Schema>& list,
               std::initializer_list<std::string_view> reserved) {
  const std::string head = std::string("TransformRegistry::add: ") + what + " '" + s.name + "'";
  if (s.name.empty())
    throw std::invalid_argument(std::string("TransformRegistry::add: a ") + what + " needs a name");
  for (const auto& o : list)
    if (o.name == s.name) throw std::invalid_argument(head + " is already registered");
  if (!has_fn) throw std::invalid_argument(head + " has no make function");
  for (const auto& p : s.params)
    for (std::string_view r : reserved)
      if (p.name == r)
        throw std::invalid_argument(head + " declares '" + p.name + "', a parameter of " +
                                    (std::string_view(what) == "transform" ? "map" : "filter") +
                                    " itself");
}

template <class Schema>
const Schema* find_named(const std::vector<Schema>& list, std::string_view name) {
  for (const auto& s : list)
    if (s.name == name) return &s;
  return nullptr;
}

template <class Schema>
std::vector<std::string> names_of(const std::vector<Schema>& list) {
  std::vector<std::string> out;
  for (const auto& s : list) out.push_back(s.name);
  return out;
}

}  // namespace

void TransformRegistry::add(TransformSchema schema) {
  check_new("transform", schema, static_cast<bool>(schema.make_sample), transforms_,
            {"fn", "workers"});
  transforms_.push_back(std::move(schema));
}

const TransformSchema* TransformRegistry::find(std::string_view name) const {
  return find_named(transforms_, name);
}

std::vector<std::string> TransformRegistry::names() const { return names_of(transforms_); }

void TransformRegistry::add(PredicateSchema schema) {
  check_new("predicate", schema, static_cast<bool>(schema.make), predicates_, {"fn"});
  predicates_.push_back(std::move(schema));
}

const PredicateSchema* TransformRegistry::find_predicate(std::string_view name) const {
  return find_named(predicates_, name);
}

std::vector<std::string> TransformRegistry::predicate_names() const {
  return names_of(predicates_);
}

TransformRegistry TransformRegistry::with_builtins() {
  TransformRegistry r;
  register_builtin_transforms(r);
  for (auto& p : builtin_predicates()) r.add(std::move(p));
  return r;
}

const TransformRegistry& TransformRegistry::builtin() {
  static const TransformRegistry r = with_builtins();
  return r;
}

TransformRegistry& TransformRegistry::global() {
  static TransformRegistry r = with_builtins();
  return r;
}

// ---- helpers ----

namespace {

/// The `field` row of every built-in transform's table (default "data", the struct's own).
template <class O>
constexpr FieldSpec<O> kFieldSpec{.doc = "the field read and replaced"};

/// Reads element i of a tensor's bytes as T (bools as 0/1, whatever byte they hold).
template <class T>
T load(const std::byte* p, std::size_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return p[i] != std::byte{0};
  } else {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
}

template <class T>
void store(std::byte* p, std::size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

/// Value conversion of `cast`: integers wrap (as static_cast does), floating-point values
/// going to integers truncate and saturate, NaN becomes 0, anything non-zero becomes true;
/// to float16/bfloat16 rounds once to nearest even (past the largest finite value: ±inf), and
/// a float16/bfloat16 converts as its exact float value does.
template <class Out, class In>
Out convert(In v) {
  if constexpr (is_half_v<In>) {
    return convert<Out>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Out, bool>) {
    return v != In{};
  } else if constexpr (std::is_floating_point_v<In> && std::is_integral_v<Out>) {
    if (std::isnan(v)) return Out{0};
    if (v <= static_cast<In>(std::numeric_limits<Out>::min()))
      return std::numeric_limits<Out>::min();
    if (v >= static_cast<In>(std::numeric_limits<Out>::max()))
      return std::numeric_limits<Out>::max();
    return static_cast<Out>(v);
  } else {
    return static_cast<Out>(v);
  }
}

Tensor cast_tensor(const Tensor& in, DType to) {
  if (in.dtype() == to) return in;
  Tensor out(to, in.shape());
  const auto* src = static_cast<const std::byte*>(in.data());
  auto* dst = static_cast<std::byte*>(out.data());
  const auto n = static_cast<std::size_t>(in.numel());
  // float32 <-> float16 in bulk (F16C where the CPU has it), when the input is aligned.
  const bool aligned = reinterpret_cast<std::uintptr_t>(in.data()) % dtype_size(in.dtype()) == 0;
  if (aligned && in.dtype() == DType::kFloat32 && to == DType::kFloat16) {
    float_to_float16(static_cast<const float*>(in.data()), static_cast<std::uint16_t*>(out.data()),
                     n);
    return out;
  }
  if (aligned && in.dtype() == DType::kFloat16 && to == DType::kFloat32) {
    float16_to_float(static_cast<const std::uint16_t*>(in.data()), static_cast<float*>(out.data()),
                     n);
    return out;
  }
  visit_dtype(in.dtype(), [&]<class In>() {
    visit_dtype(to, [&]<class Out>() {
      for (std::size_t i = 0; i < n; ++i) store<Out>(dst, i, convert<Out>(load<In>(src, i)));
    });
  });
  return out;
}

Tensor normalize_tensor(const Tensor& in, double mean, double std) {
  Tensor out(DType::kFloat32, in.shape());
  const auto* src = static_cast<const std::byte*>(in.data());
  auto* dst = static_cast<float*>(out.data());
  const auto n = static_cast<std::size_t>(in.numel());
  const double inv = 1.0 / std;
  visit_dtype(in.dtype(), [&]<class In>() {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = static_cast<float>((static_cast<double>(load<In>(src, i)) - mean) * inv);
  });
  return out;
}

/// The field a transform works on, by id; a missing field is a configuration error.
class FieldRef {
 public:
  explicit FieldRef(std::string name) : name_(std::move(name)), id_(field_id(name_)) {}
  const Tensor& get(const Fields& fields, const Params& p) const {
    const Tensor* t = fields.find(id_);
    if (t == nullptr) {
      std::string have;
      for (const auto& [id, unused] : fields)
        have += (have.empty() ? "" : ", ") + std::string(field_name(id));
      throw param_error(
          p, "field",
          "no field '" + name_ + "' to transform (the " +
              (have.empty() ? std::string("input has no fields") : "fields are: " + have) + ")");
    }
    return *t;
  }
  FieldId id() const { return id_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  FieldId id_;
};

/// A transform of one field operation: `make_op(options)` returns the tensor -> tensor
/// function applied to the field, per sample or to the collated batch.
using FieldOp = std::function<Tensor(const Tensor&)>;
template <class O>
TransformSchema field_op_transform(std::string name, std::string doc,
                                   FieldOp (*make_op)(const O&)) {
  return define_transform<O>(
      std::move(name), std::move(doc),
      [make_op](const O& o, const Params& p) -> SampleFn {
        return [op = make_op(o), field = FieldRef(o.field), p](Sample& s, MapContext&) {
          s.set(field.id(), op(field.get(s, p)));
        };
      },
      [make_op](const O& o, const Params& p) -> BatchFn {
        return [op = make_op(o), field = FieldRef(o.field), p](Batch& b, MapContext&) {
          b.fields.set(field.id(), op(field.get(b.fields, p)));
        };
      });
}

// ---- decode ----

std::string check_decode_shape(const ParamValue& v) {
  const auto& dims = std::get<std::vector<std::int64_t>>(v);
  if (dims.size() > Shape::kMaxRank - 1)
    return "has " + std::to_string(dims.size()) + " dimensions; at most " +
           std::to_string(Shape::kMaxRank - 1) + " are supported";
  int inferred = 0;
  for (auto d : dims) {
    if (d == -1) {
      ++inferred;
    } else if (d < 0) {
      return "dimension " + std::to_string(d) + " is negative (use -1 for one inferred dimension)";
    }
  }
  if (inferred > 1) return "may infer (-1) at most one dimension";
  return "";
}

/// The decoding of one row of `row_bytes` bytes.
struct DecodeSpec {
  DType dtype;
  std::optional<std::vector<std::int64_t>> dims;  ///< none: 1-D, inferred

  /// The shape of one row; `where` names the record or batch ("in record 0:17"). A row that
  /// the shape does not fit is a DataError: the record's size is what the data says.
  Shape row_shape(std::size_t row_bytes, const Params& p, const std::string& field,
                  const std::string& where) const {
    const std::size_t elem = dtype_size(dtype);
    auto mismatch = [&](const std::string& need) {
      return param_data_error(p, dims ? "shape" : "dtype",
                              "field '" + field + "' holds " + std::to_string(row_bytes) +
                                  " bytes per sample, " + need + " (" + where + ")");
    };
    if (!dims) {
      if (row_bytes % elem != 0)
        throw mismatch("not a multiple of the " + std::to_string(elem) + "-byte " +
                       std::string(dtype_name(dtype)));
      return Shape{static_cast<std::int64_t>(row_bytes / elem)};
    }
    std::vector<std::int64_t> d = *dims;
    std::uint64_t known = 1;
    std::size_t infer = d.size();
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (d[i] == -1)
        infer = i;
      else
        known *= static_cast<std::uint64_t>(d[i]);
    }
    Shape want = Shape::of(d);
    std::string want_text = "but " + std::string(dtype_name(dtype)) + " " + want.to_string();
    if (infer < d.size()) {
      if (known == 0 || row_bytes % (known * elem) != 0)
        throw mismatch(want_text + " cannot cover them evenly");
      d[infer] = static_cast<std::int64_t>(row_bytes / (known * elem));
    } else if (known * elem != row_bytes) {
      throw mismatch(want_text + " needs " + std::to_string(known * elem) + " bytes");
    }
    return Shape::of(d);
  }
};

/// The bytes of `in` (rows × row shape) reinterpreted as little-endian `dtype`. Zero-copy
/// when the host is little-endian and the data is aligned; bools are normalized to 0/1.
Tensor decode_bytes(const Tensor& in, DType dtype, const Shape& shape) {
  const std::size_t elem = dtype_size(dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(in.data()) % elem == 0;
  if (std::endian::native == std::endian::little && aligned && dtype != DType::kBool)
    return Tensor(in.buffer(), in.offset(), dtype, shape);
  Tensor out(dtype, shape);
  const auto* src = static_cast<const std::byte*>(in.data());
  auto* dst = static_cast<std::byte*>(out.data());
  const std::size_t n = out.nbytes();
  if (dtype == DType::kBool) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::byte{src[i] != std::byte{0}};
  } else if (std::endian::native == std::endian::little || elem == 1) {
    std::memcpy(dst, src, n);
  } else {
    for (std::size_t i = 0; i < n; i += elem)
      for (std::size_t b = 0; b < elem; ++b) dst[i + b] = src[i + elem - 1 - b];
  }
  return out;
}

struct DecodeOptions {
  std::string field = "data";
  DType dtype = DType::kUInt8;
  std::optional<std::vector<std::int64_t>> shape;
  static constexpr auto table() {
    return std::tuple{param("field", &DecodeOptions::field, kFieldSpec<DecodeOptions>),
                      param("dtype", &DecodeOptions::dtype,
                            {.required = true, .doc = "element type of the decoded tensor"}),
                      param("shape", &DecodeOptions::shape,
                            {.doc = "shape of one sample's tensor; -1 infers one dimension",
                             .default_doc = "1-D, from the record size",
                             .check = check_decode_shape})};
  }
};

TransformSchema decode_transform() {
  return define_transform<DecodeOptions>(
      "decode", "little-endian record bytes -> a tensor of dtype and shape",
      [](const DecodeOptions& o, const Params& p) -> SampleFn {
        return [spec = DecodeSpec{o.dtype, o.shape}, field = FieldRef(o.field), p](Sample& s,
                                                                                   MapContext&) {
          const Tensor& in = field.get(s, p);
          Shape shape =
              spec.row_shape(in.nbytes(), p, field.name(), "in record " + s.ref.to_string());
          s.set(field.id(), decode_bytes(in, spec.dtype, shape));
        };
      },
      [](const DecodeOptions& o, const Params& p) -> BatchFn {
        return [spec = DecodeSpec{o.dtype, o.shape}, field = FieldRef(o.field), p](Batch& b,
                                                                                   MapContext&) {
          const Tensor& in = field.get(b.fields, p);
          if (in.shape().rank() == 0)
            throw param_data_error(p, "field",
                                   "field '" + field.name() + "' is a scalar, not a batch");
          const std::int64_t rows = in.shape()[0];
          const std::size_t row_bytes =
              rows == 0 ? 0 : in.nbytes() / static_cast<std::size_t>(rows);
          Shape shape =
              spec.row_shape(row_bytes, p, field.name(), "in a batch of " + std::to_string(rows))
                  .prepend(rows);
          b.fields.set(field.id(), decode_bytes(in, spec.dtype, shape));
        };
      });
}

// ---- cast ----

struct CastOptions {
  std::string field = "data";
  DType dtype = DType::kUInt8;
  static constexpr auto table() {
    return std::tuple{
        param("field", &CastOptions::field, kFieldSpec<CastOptions>),
        param("dtype", &CastOptions::dtype, {.required = true, .doc = "the new element type"})};
  }
};

TransformSchema cast_transform() {
  return field_op_transform<CastOptions>(
      "cast",
      "converts values to dtype (integers wrap; floats to integers saturate, NaN -> 0; to "
      "float16/bfloat16 rounds to nearest even)",
      [](const CastOptions& o) -> FieldOp {
        return [to = o.dtype](const Tensor& in) { return cast_tensor(in, to); };
      });
}

// ---- normalize ----

struct NormalizeOptions {
  std::string field = "data";
  double mean = 0.0;
  double std = 1.0;
  static constexpr auto table() {
    return std::tuple{
        param("field", &NormalizeOptions::field, kFieldSpec<NormalizeOptions>),
        param("mean", &NormalizeOptions::mean, {.doc = "subtracted from every value"}),
        param("std", &NormalizeOptions::std,
              {.doc = "divides every value; > 0", .check = [](const ParamValue& v) -> std::string {
                 return std::get<double>(v) > 0 ? "" : "must be greater than zero";
               }})};
  }
};

TransformSchema normalize_transform() {
  return field_op_transform<NormalizeOptions>(
      "normalize", "(x - mean) / std, as float32", [](const NormalizeOptions& o) -> FieldOp {
        return [mean = o.mean, std = o.std](const Tensor& in) {
          return normalize_tensor(in, mean, std);
        };
      });
}

// ---- slice / random_crop ----

/// Rows [start, start + length) of the first dimension, sharing the bytes.
Tensor rows(const Tensor& in, std::int64_t start, std::int64_t length) {
  Shape shape = in.shape();
  const std::size_t row_bytes =
      shape[0] == 0 ? 0 : in.nbytes() / static_cast<std::size_t>(shape[0]);
  shape[0] = length;
  return Tensor(in.buffer(), in.offset() + static_cast<std::size_t>(start) * row_bytes, in.dtype(),
                shape);
}

const Tensor& first_dim_field(const Sample& s, const FieldRef& field, const Params& p,
                              std::string_view length_param, std::uint64_t need) {
  const Tensor& in = field.get(s, p);
  // What the record holds is data: a record too short for the crop is a DataError.
  if (in.shape().rank() == 0)
    throw param_data_error(p, "field",
                           "field '" + field.name() + "' is a scalar in record " +
                               s.ref.to_string() + "; there is no dimension to cut");
  if (static_cast<std::uint64_t>(in.shape()[0]) < need)
    throw param_data_error(p, length_param,
                           "needs " + std::to_string(need) + " rows, but field '" + field.name() +
                               "' has shape " + in.shape().to_string() + " in record " +
                               s.ref.to_string());
  return in;
}

/// Row counts and starts: whole numbers a double holds exactly.
constexpr double kMaxRows = 9.0e15;

struct SliceOptions {
  std::string field = "data";
  std::uint64_t start = 0;
  std::uint64_t length = 0;
  static constexpr auto table() {
    return std::tuple{param("field", &SliceOptions::field, kFieldSpec<SliceOptions>),
                      param("start", &SliceOptions::start, {.max = kMaxRows, .doc = "first row"}),
                      param("length", &SliceOptions::length,
                            {.min = 1, .max = kMaxRows, .required = true, .doc = "rows kept"})};
  }
};

TransformSchema slice_transform() {
  return define_transform<SliceOptions>(
      "slice", "the rows [start, start + length) of the first dimension",
      [](const SliceOptions& o, const Params& p) -> SampleFn {
        auto start = static_cast<std::int64_t>(o.start);
        auto length = static_cast<std::int64_t>(o.length);
        return [start, length, field = FieldRef(o.field), p](Sample& s, MapContext&) {
          const Tensor& in =
              first_dim_field(s, field, p, "length", static_cast<std::uint64_t>(start + length));
          s.set(field.id(), rows(in, start, length));
        };
      });
}

struct RandomCropOptions {
  std::string field = "data";
  std::uint64_t length = 0;
  static constexpr auto table() {
    return std::tuple{param("field", &RandomCropOptions::field, kFieldSpec<RandomCropOptions>),
                      param("length", &RandomCropOptions::length,
                            {.min = 1, .max = kMaxRows, .required = true, .doc = "rows kept"})};
  }
};

TransformSchema random_crop_transform() {
  return define_transform<RandomCropOptions>(
      "random_crop", "length consecutive rows of the first dimension at a random start",
      [](const RandomCropOptions& o, const Params& p) -> SampleFn {
        auto length = static_cast<std::int64_t>(o.length);
        return [length, field = FieldRef(o.field), p](Sample& s, MapContext& ctx) {
          const Tensor& in =
              first_dim_field(s, field, p, "length", static_cast<std::uint64_t>(length));
          // The element's own generator: the same start for any worker count and after a
          // resume.
          auto start = static_cast<std::int64_t>(
              ctx.rng.below(static_cast<std::uint64_t>(in.shape()[0] - length) + 1));
          s.set(field.id(), rows(in, start, length));
        };
      });
}

// ---- parse_int ----

struct ParseIntOptions {
  std::string field = "cls";
  static constexpr auto table() {
    return std::tuple{param("field", &ParseIntOptions::field,
                            {.doc = "the field holding the text, replaced by the number"})};
  }
};

/// ASCII decimal text (a WebDataset `.cls` member: "417", surrounding whitespace allowed) -> an
/// int64 scalar; anything else is a DataError naming the record.
TransformSchema parse_int_transform() {
  return define_transform<ParseIntOptions>(
      "parse_int", "decimal text (a WebDataset .cls label) -> an int64 scalar",
      [](const ParseIntOptions& o, const Params& p) -> SampleFn {
        return [field = FieldRef(o.field), p](Sample& s, MapContext&) {
          const Tensor& in = field.get(s, p);
          std::string_view text(static_cast<const char*>(in.data()), in.nbytes());
          while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0)
            text.remove_prefix(1);
          while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0)
            text.remove_suffix(1);
          std::int64_t v = 0;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (text.empty() || ec != std::errc() || end != text.data() + text.size())
            throw param_data_error(p, "field",
                                   "field '" + field.name() + "' of record " + s.ref.to_string() +
                                       " holds '" + std::string(text.substr(0, 40)) +
                                       "', not a decimal integer");
          Tensor out(DType::kInt64, Shape{});
          std::memcpy(out.data(), &v, sizeof(v));
          s.set(field.id(), std::move(out));
        };
      });
}

}  // namespace

ParamSchema field_param() { return schema_of<CastOptions>().front(); }

void register_builtin_transforms(TransformRegistry& registry) {
  registry.add(decode_transform());
  registry.add(cast_transform());
  registry.add(normalize_transform());
  registry.add(slice_transform());
  registry.add(random_crop_transform());
  registry.add(parse_int_transform());
  for (auto& t : image_transforms()) registry.add(std::move(t));
}

}  // namespace flowstate

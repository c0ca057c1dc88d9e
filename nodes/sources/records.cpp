#include "flowstate/nodes/sources/records.h"

#include <algorithm>
#include <cstring>

#include "flowstate/core/error.h"

namespace flowstate {

const NodeDef& records_node() {
  static const NodeDef def = define_file_source<RecordsSource, RecordsOptions>(
      {.type = "records",
       .doc = "fixed-size records in shard files (e.g. token .bin files), memory-mapped"});
  return def;
}

RecordsSource::RecordsSource(std::string name, RecordsOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "records", "records", source_id),
      options_(std::move(options)),
      field_(field_id(options_.field)) {
  validate_fields(options_, "records");
  for (const auto& named : expand_named_paths(options_.paths, options_.base_dir)) {
    const std::string& f = named.path;
    auto m = std::make_shared<const MappedFile>(f);
    if (m->size() % options_.record_bytes != 0)
      throw DataError(f, m->size() - m->size() % options_.record_bytes,
                      "size of '" + f + "' (" + std::to_string(m->size()) +
                          " bytes) is not a multiple of record_bytes (" +
                          std::to_string(options_.record_bytes) + ")");
    add_file(named, *m, m->size() / options_.record_bytes);
    maps_.push_back(std::move(m));
  }
}

std::span<const std::byte> RecordsSource::record(const Ref& ref) const {
  const std::size_t offset = local(ref) * options_.record_bytes;
  return {maps_[ref.shard]->data() + offset, options_.record_bytes};
}

void RecordsSource::read(const Ref& ref, Sample& sample) const {
  // A copy, not a view of the read-only mapping: maps may modify samples in place.
  auto bytes = record(ref);
  sample.ref = ref;
  sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
}

}  // namespace flowstate

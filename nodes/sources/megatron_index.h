// Megatron-LM's indexed data set format (the MMapIndexedDataset layout that Megatron-LM,
// NeMo and GPT-NeoX write): PREFIX.idx describing the sequences of PREFIX.bin. The `indexed`
// source (indexed.h) reads it; `flowstate gen indexed` and the tests write it.
//
// PREFIX.idx, little-endian:
//   "MMIDIDX\0\0"  u64 version (1)  u8 dtype code  u64 S (sequences)  u64 D (entries of the
//   document index, i.e. documents + 1)  i32 lengths[S] (items)  i64 pointers[S] (byte offsets
//   into .bin)  i64 document_index[D] (document d is sequences [doc[d], doc[d+1]))
//   and, in multimodal sets, i8 modes[S] (ignored).
// dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
//
// Writing: PREFIX.bin is the sequences' items end to end, little-endian; megatron_index makes
// the PREFIX.idx that describes them (`flowstate gen indexed` and the tests write through it):
//
//   write(prefix + ".idx", megatron_index(DType::kUInt16, lengths));  // a document a sequence
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "flowstate/core/dtype.h"

namespace flowstate {

/// A PREFIX.idx starts with these 9 bytes ("MMIDIDX\0\0": the literal's own NUL is the
/// ninth), then its version, dtype code and two counts.
inline constexpr char kMegatronMagic[] = "MMIDIDX\0";
static_assert(sizeof(kMegatronMagic) == 9);
/// The header's bytes: the magic, u64 version, u8 dtype code, u64 sequences, u64 entries.
inline constexpr std::size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

/// The dtype of Megatron's dtype code; nullopt for an unknown code.
std::optional<DType> megatron_dtype(std::uint8_t code);
/// Megatron's code of `dtype`; nullopt for one it cannot hold (uint32, uint64, bool).
std::optional<std::uint8_t> megatron_dtype_code(DType dtype);
/// PREFIX.bin for PREFIX.idx (a path or a URL; `idx` itself + ".bin" when it does not end in
/// ".idx").
std::string megatron_bin_path(const std::string& idx);

/// The bytes of a PREFIX.idx (version 1) for sequences of `lengths` items of `dtype` lying end
/// to end in PREFIX.bin: pointers[s] is the sum of the lengths before s times the item size.
/// `documents` is the document index (document d is sequences [documents[d],
/// documents[d + 1])): it starts at 0, never decreases and ends at the number of sequences;
/// empty, each sequence is a document. Throws std::invalid_argument for a dtype Megatron has
/// no code for, a negative length or a document index other than that.
std::string megatron_index(DType dtype, std::span<const std::int32_t> lengths,
                           std::span<const std::uint64_t> documents = {});

}  // namespace flowstate

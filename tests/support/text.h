// Text corpora and SentencePiece models made at test time (the tokenize node's tests): the
// synthetic text of `flowstate gen text` (nodes/sources/lines.h) as JSON Lines, and a small model
// trained on it by Debian's `spm_train` — nothing downloaded, nothing binary in the tree.
#pragma once

#include <cstdint>
#include <string>

namespace flowstate::testing {

/// Writes documents [0, docs) of synthetic_text(seed, i, words) to `path` as JSON Lines
/// {"text": ...} (what `flowstate gen text` writes).
void write_text_jsonl(const std::string& path, std::uint64_t docs, std::uint64_t words,
                      std::uint64_t seed = 7);

/// Trains a SentencePiece model of `vocab` pieces with `spm_train` on `docs` synthetic documents
/// of `words` words (one per line) and returns the path of `<dir>/<name>.model`; `extra` goes
/// to spm_train's command line as it is ("--bos_id=-1"). About a second for a vocabulary of 500
/// on 400 documents of 120 words. Fails the calling test (and returns "") when spm_train does.
std::string train_sentencepiece(const std::string& dir, const std::string& name,
                                std::uint64_t vocab, std::uint64_t docs = 400,
                                std::uint64_t words = 120, const std::string& extra = "");

}  // namespace flowstate::testing

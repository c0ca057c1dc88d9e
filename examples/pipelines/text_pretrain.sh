#!/usr/bin/env bash
# Raw-text pre-training from one command: makes a JSON Lines corpus (`flowstate gen text`),
# trains a SentencePiece model on part of it (Debian's spm_train), then runs
# text_pretrain.yaml beside them. What is already there (the corpus, the model) is kept.
#
#   bash examples/pipelines/text_pretrain.sh [--dir DIR] [--docs N] [--train-docs N]
#                                            [--vocab V] [-- RUN ARGS...]
#
# DIR defaults to build/text_pretrain; RUN ARGS go to `flowstate run` (--steps 100, --resume,
# --checkpoint-every 50, --workers 1, ...). FLOWSTATE_CLI names the command (default:
# `flowstate` on PATH, else build/dev/cli/flowstate of this tree).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=$root/build/text_pretrain docs=20000 train_docs=2000 vocab=4000
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --docs) docs=$2; shift 2 ;;
    --train-docs) train_docs=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "text_pretrain.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "${1:-}" == "--" ]] && shift
fs=${FLOWSTATE_CLI:-}
if [[ -z "$fs" ]]; then fs=$(command -v flowstate || echo "$root/build/dev/cli/flowstate"); fi
command -v spm_train >/dev/null || { echo "text_pretrain.sh: needs spm_train (Debian package 'sentencepiece')" >&2; exit 2; }

mkdir -p "$dir"
cp "$here/text_pretrain.yaml" "$dir/"
cd "$dir"
[[ -e data/text-00000.jsonl ]] || "$fs" gen text --out data --docs "$docs" --shards 4
if [[ ! -e spm/m.model ]]; then
  "$fs" gen text --out spm --docs "$train_docs" --txt
  spm_train --input=spm/text-00000.txt --model_prefix=spm/m --vocab_size="$vocab" \
            --max_sentence_length=65536 --minloglevel=2 > spm/train.log 2>&1 ||
    { cat spm/train.log >&2; exit 1; }
  echo "text_pretrain.sh: trained spm/m.model ($vocab pieces) on $train_docs documents" >&2
fi
exec "$fs" run text_pretrain.yaml "$@"

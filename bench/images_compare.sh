#!/usr/bin/env bash
# Issue 24's image benchmark, interleaved round by round on the same cores: flowstate
# (bench/images_fused.yaml: the crop fused into the decode; bench/images.yaml: decode at
# min_size 224, then random_resized_crop; through `flowstate bench`, 2 workers) against
# torchvision in a torch DataLoader(num_workers=2) over the same tars (bench/images_torch.py),
# plus libjpeg-turbo's own decode speed alone (images_decode_ceiling.py).
#
#   bench/images_compare.sh [--rounds 3] [--images 2048] [--flowstate build/dev/cli/flowstate]
# Data: /tmp/flowstate-images (flowstate gen images, 300-800 px JPEGs), made when missing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3
images=2048
fs="$root/build/dev/cli/flowstate"
data=/tmp/flowstate-images
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --flowstate) fs=$2; shift 2 ;;
    *) echo "images_compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ ! -f $data/images-00000.tar ]]; then
  "$fs" gen images --out "$data" --samples "$images" --shards 4
fi
steps=$(( images / 256 - 1 ))
for r in $(seq "$rounds"); do
  "$fs" bench "$root/bench/images.yaml" --steps "$steps" --warmup 1 --repeat 1 --json - 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(json.dumps({"round": '"$r"', "impl": "flowstate min_size 224", "images_per_s": j["samples_per_s"]["median"]}))'
  "$fs" bench "$root/bench/images_fused.yaml" --steps "$steps" --warmup 1 --repeat 1 --json - 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(json.dumps({"round": '"$r"', "impl": "flowstate fused crop decode", "images_per_s": j["samples_per_s"]["median"]}))'
  /usr/bin/python3 "$root/bench/images_torch.py" --data "$data" --workers 2 --batches "$steps" --warmup 1
done
/usr/bin/python3 "$root/bench/images_decode_ceiling.py" --data "$data" --images 500

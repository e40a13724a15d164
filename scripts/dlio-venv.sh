#!/usr/bin/env bash
# An optional virtual environment with DLIO 2.0.0 (MLPerf Storage's engine), for
# benchmarks/storage_vs_dlio.py only (the DLIO side of the comparison). It is kept out of the
# project's .venv on purpose: DLIO pulls TensorFlow, which pins its own numpy/protobuf.
#
#   bash scripts/dlio-venv.sh [DIR]      # default $TUNELAB_DLIO_VENV or ~/.cache/tunelab/dlio-venv
#   .venv/bin/python benchmarks/storage_vs_dlio.py --dlio-venv DIR
#
# Install facts (DLIO 2.0.0 on PyPI):
# * its dependency nvidia-dali-cuda110 resolves to a stub that downloads from an index this
#   machine cannot reach, and DALI is needed only by DALI data loaders: DLIO's own
#   dependencies are installed here one by one, then `pip install --no-deps dlio_benchmark`;
# * torchaudio is left out: no release pairs with the pinned CPU torch, and DLIO imports it
#   nowhere (torch and torchvision are its PyTorch framework's; the comparison uses the
#   TensorFlow data loader of MLPerf Storage's resnet50 workload);
# * its TFRecord generator calls DALI's `tfrecord2idx FILE INDEX`: a stand-in written into the
#   venv's bin/ writes the same index (one "offset size" line per record). Put DIR/bin first on
#   PATH (mpirun -x PATH) so DLIO finds it.
#
# A few minutes on a fresh machine; a second run only checks that DLIO imports.
set -euo pipefail

DIR=${1:-${TUNELAB_DLIO_VENV:-$HOME/.cache/tunelab/dlio-venv}}
. "$(dirname "${BASH_SOURCE[0]}")/venv-common.sh"
# Pinned: the versions the comparison in docs/workloads/ddp.md was measured with.
PACKAGES=("tensorflow-cpu==2.21.0" "torch==2.13.0" "torchvision==0.28.0" "pillow==13.0.0"
          "PyYAML==6.0.3" "h5py==3.14.0" "mpi4py==4.1.2" "omegaconf==2.3.0" "hydra-core==1.3.2"
          "pandas==2.3.3" "psutil==7.2.2" "pydftracer==1.0.2")
DLIO="dlio_benchmark==2.0.0"

check() {
  "$DIR/bin/python" -c "import dlio_benchmark.main, tensorflow" 2>/dev/null \
    && [ -x "$DIR/bin/tfrecord2idx" ]
}

if [ -x "$DIR/bin/python" ] && check; then
  echo "dlio-venv: $DIR already has DLIO ($("$DIR/bin/python" -m pip show dlio_benchmark 2>/dev/null | sed -n 's/^Version: //p'))"
  exit 0
fi
echo "dlio-venv: creating $DIR (${PACKAGES[*]} $DLIO)"
new_venv "$DIR"
"$DIR/bin/python" -m pip install -q "${PACKAGES[@]}"
"$DIR/bin/python" -m pip install -q --no-deps "$DLIO"

cat > "$DIR/bin/tfrecord2idx" <<EOF
#!$DIR/bin/python
"""Stand-in for DALI's tfrecord2idx: one 'offset size' line per record of a TFRecord file
(a record: 8-byte length, 4-byte CRC, the data, 4-byte CRC)."""
import struct
import sys

src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f, open(dst, "w") as out:
    offset = 0
    while True:
        head = f.read(12)
        if len(head) < 12:
            break
        (length,) = struct.unpack("<Q", head[:8])
        f.seek(length + 4, 1)
        out.write(f"{offset} {12 + length + 4}\n")
        offset += 12 + length + 4
EOF
chmod +x "$DIR/bin/tfrecord2idx"
check || { echo "dlio-venv: DLIO does not import in $DIR" >&2; exit 1; }
echo "dlio-venv: done; pass --dlio-venv $DIR to benchmarks/storage_vs_dlio.py"

#!/usr/bin/env bash
# An optional virtual environment with Keras 3 on a CPU build of TensorFlow, for
# benchmarks/leopard_vs_keras.py only (the Keras side of the comparison). It is kept out of the
# project's .venv on purpose: TensorFlow pins its own numpy/protobuf and weighs ~600 MB.
#
#   bash scripts/keras-venv.sh [DIR]      # default $TUNELAB_KERAS_VENV or ~/.cache/tunelab/keras-venv
#   .venv/bin/python benchmarks/leopard_vs_keras.py --keras-python DIR/bin/python
#
# About two minutes on a fresh machine; a second run only checks that Keras imports.
set -euo pipefail

DIR=${1:-${TUNELAB_KERAS_VENV:-$HOME/.cache/tunelab/keras-venv}}
. "$(dirname "${BASH_SOURCE[0]}")/venv-common.sh"
# Pinned: the versions the comparison in docs/workloads/leopard.md was measured with.
PACKAGES=("tensorflow-cpu==2.21.0" "keras==3.15.1")

if [ -x "$DIR/bin/python" ] && "$DIR/bin/python" -c "import keras, tensorflow" 2>/dev/null; then
  echo "keras-venv: $DIR already has Keras ($("$DIR/bin/python" -c 'import keras; print(keras.__version__)'))"
  exit 0
fi
echo "keras-venv: creating $DIR (${PACKAGES[*]})"
new_venv "$DIR"
"$DIR/bin/python" -m pip install -q "${PACKAGES[@]}"
"$DIR/bin/python" -c "import keras, tensorflow as tf; print('keras-venv: keras', keras.__version__, 'tensorflow', tf.__version__)"
echo "keras-venv: done; pass --keras-python $DIR/bin/python to benchmarks/leopard_vs_keras.py"

# Sourced (not run) by the optional venv scripts: dlio-venv.sh, keras-venv.sh, ucx-venv.sh.

# new_venv DIR: a fresh virtual environment at DIR (its parent made first) with pip upgraded,
# made by $PYTHON (default python3).
new_venv() {
  mkdir -p "$(dirname "$1")"
  "${PYTHON:-python3}" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip
}

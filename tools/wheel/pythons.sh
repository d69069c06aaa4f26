# Sourced by tools/build_wheel.sh and tools/wheel/portable_test.sh: the
# CPython interpreters zcc's wheels are built for and tested with.
#
#   zcc_find_python 3.12   prints an interpreter of that version: pyenv's newest
#                          3.12.*, else /usr/bin/python3.12, else python3.12 on
#                          PATH; prints nothing (status 1) when there is none
#   ZCC_WHEEL_PYTHON_VERSIONS   the versions wheels are built for (3.10-3.13)
ZCC_WHEEL_PYTHON_VERSIONS=(3.10 3.11 3.12 3.13)

zcc_find_python() {
  local version=$1 pyenv_root candidate
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in $(ls -d "$pyenv_root"/versions/"$version".* 2>/dev/null | sort -V -r); do
    if [[ -x $candidate/bin/python3 && $candidate =~ /$version\.[0-9]+$ ]]; then
      echo "$candidate/bin/python3"
      return 0
    fi
  done
  if [[ -x /usr/bin/python$version ]]; then
    echo "/usr/bin/python$version"
    return 0
  fi
  command -v "python$version" 2>/dev/null
}

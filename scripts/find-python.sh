# Sourced by scripts/build-wheels.sh and scripts/check-wheels.sh: find_python X.Y prints an
# interpreter of that CPython version, or nothing: pyenv's (`pyenv root`/versions/X.Y.*), else
# pythonX.Y on PATH, else Debian's /usr/bin/python3 when it is that version.
find_python() {
  local v=$1 p pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for p in "$pyenv_root"/versions/"$v".*/bin/python"$v" "$(command -v "python$v" || true)" \
    /usr/bin/python3; do
    [ -x "$p" ] || continue
    [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ] &&
      { echo "$p"; return; }
  done
  return 0
}

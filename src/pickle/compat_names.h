#pragma once
// The module/name renames CPython's pickle applies between Python 2 and 3 names for protocols
// below 3 (fix_imports): "__builtin__" <-> "builtins", "copy_reg" <-> "copyreg", ...

#include <string>

namespace ckpt::internal {

// Unpickling a protocol 0-2 pickle: Python 2 names -> Python 3 names, in place.
void rename_py2_to_py3(std::string& module, std::string& name);
// Pickling with protocol 2: Python 3 names -> the Python 2 names CPython writes, in place.
void rename_py3_to_py2(std::string& module, std::string& name);

}  // namespace ckpt::internal

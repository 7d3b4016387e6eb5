#!/bin/sh
# Branches on a reader format, a target format or a checkpoint kind outside the places that decide
# them (src/api/opener.cc, src/convert/target_format.cc, src/util/format.cc): a Format::k... or
# ConvertFormat::k... named in code, a test of a target's type (get_if / holds_alternative), an
# overload of a visitor over target types, a dynamic_cast to a kind. A reader stating its own
# format (`->format = Format::k...;`) and the model's default are not branches.
# usage: scripts/count_format_branches.sh [REV]   (no REV: the working tree)
T='(PtTarget|SafetensorsTarget|TensorizerTarget|DcpTarget|TorchSaveOptions|SaveOptions|SafetensorsSaveOptions|TensorizerSaveOptions|DcpSaveOptions|std::monostate)'
PAT="\bFormat::k[A-Z]|ConvertFormat::k[A-Z]|get_if<$T>|holds_alternative<$T>|operator\(\)\(const $T&|dynamic_cast<[^>]*Kind\b"
if [ -n "$1" ]; then git grep -nE "$PAT" "$1" -- src python/src tools capi; else grep -rnE "$PAT" src python/src tools capi; fi |
  grep -v -e src/api/opener.cc -e src/convert/target_format.cc -e src/util/format.cc |
  grep -vE -e '(->|\.)format = Format::k[A-Za-z]+;' -e 'Format format = Format::k'

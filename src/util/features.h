#pragma once
// The optional features of a build (docs/library.md "Dependencies"): what a feature whose library
// was not found at configure time throws when it is asked for.

#include <string>

#include "ckpt/error.h"

namespace ckpt::internal {

// Error{kUnsupported} "this ckpt was built without <library>, which <what_needs>: install
// <Debian package> (Debian/Ubuntu), <Fedora package> (Fedora) or <conda package> (conda-forge),
// then rebuild". `library` is one of "libcurl", "libsodium", "OpenSSL" (the SHA-256 providers:
// OpenSSL's libcrypto, else libsodium), "yaml-cpp".
// `what_needs` is the feature and its verb: "HTTP(S) and S3 need".
Error missing_feature(const std::string& library, const std::string& what_needs,
                      const std::string& source = {});

}  // namespace ckpt::internal

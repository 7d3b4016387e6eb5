#pragma once
// Everything public.
#include "ckpt/checkpoint.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"
#include "ckpt/torchscript.h"
#include "ckpt/value.h"

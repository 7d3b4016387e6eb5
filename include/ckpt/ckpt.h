#pragma once
// The whole public API: include this one header.
//
//   checkpoint.h         Checkpoint: open any supported file, shard set or DCP folder; list, load
//                        (eager, views, stream, slices)
//   convert.h            convert(): one checkpoint into another format; flatten_state_dict()
//   digest.h             SHA-256 of tensors and files, digest manifests, stored digests
//   torch.h              save_torch(), state_dict_value()
//   safetensors.h        save_safetensors()
//   tensorizer.h         save_tensorizer() (with encryption)
//   dcp.h                save_dcp(): a torch.distributed.checkpoint folder
//   torchscript.h        TorchScriptArchive: code, debug info, constants, rewrite
//   tensor.h, value.h    Tensor/Storage/TensorInfo, the object tree
//   source.h, sink.h     where bytes come from and go to (files, memory, your own)
//   memory.h             memory of eager loads kept for the next one
//   device.h             Device (cpu, cuda:N): where loads put the bytes; CUDA by dlopen
//   remote.h             http(s):// and s3:// sources, the S3 upload sink
//   onnx.h, onnx_types.h ONNX: initializer places, onnxruntime's pre-packed blobs, the rewrite
//   prepack.h            the pre-pack cache (onnxruntime-style packed weights, any format)
//   torchscript_types.h  TorchScript archive vocabulary (code, debug ranges, constants)
//   features.h           build_features(): the optional features this build has
//   error.h, dtype.h, format.h, options.h
#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"
#include "ckpt/dcp.h"
#include "ckpt/device.h"
#include "ckpt/digest.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/features.h"
#include "ckpt/format.h"
#include "ckpt/memory.h"
#include "ckpt/onnx.h"
#include "ckpt/onnx_types.h"
#include "ckpt/options.h"
#include "ckpt/prepack.h"
#include "ckpt/rank_plan.h"
#include "ckpt/remote.h"
#include "ckpt/safetensors.h"
#include "ckpt/sink.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"
#include "ckpt/tensorizer.h"
#include "ckpt/torch.h"
#include "ckpt/torchscript.h"
#include "ckpt/torchscript_types.h"
#include "ckpt/value.h"

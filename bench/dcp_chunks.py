#!/usr/bin/env python3
"""A DCP folder OUT holding one float32 tensor of ROWS x 2 in ROWS row chunks (one storage item
each, in one data file), written with torch's own Metadata classes and torch.save items as
torch's FileSystemWriter lays them out: for timing `ckpt ls OUT` on a tensor of many chunks
(docs/benchmarks/dcp.md, "Opening a DCP folder of many keys").

    $VPY bench/dcp_chunks.py 50000 build/c50k
"""
import io
import os
import pickle
import sys

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)


def main():
    rows, out = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    chunks, storage = [], {}
    with open(os.path.join(out, "__0_0.distcp"), "wb") as f:
        for r in range(rows):
            buf = io.BytesIO()
            torch.save(torch.full((1, 2), float(r)), buf)
            data = buf.getvalue()
            chunks.append(ChunkStorageMetadata(offsets=torch.Size([r, 0]),
                                               sizes=torch.Size([1, 2])))
            storage[MetadataIndex("w", torch.Size([r, 0]), r)] = _StorageInfo(
                "__0_0.distcp", f.tell(), len(data))
            f.write(data)
    md = Metadata(state_dict_metadata={"w": TensorStorageMetadata(
        TensorProperties(dtype=torch.float32), torch.Size([rows, 2]), chunks)},
        planner_data={"w": ("w",)}, storage_data=storage)
    with open(os.path.join(out, ".metadata"), "wb") as f:
        pickle.dump(md, f)


if __name__ == "__main__":
    main()

// A consumer of an installed ckpt: public header only. Saves a small state dict, opens it again
// and checks a tensor's bytes. Built by scripts/check-install.sh with find_package(ckpt) and
// with pkg-config --static.
#include <ckpt/ckpt.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

int main() {
  try {
    float w[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 42.0f};
    std::vector<ckpt::Tensor> ts = {
        ckpt::Tensor::from_bytes("layer.weight", ckpt::DType::kFloat32, {2, 3},
                                 {reinterpret_cast<const std::byte*>(w), sizeof w})};

    char dir[] = "/tmp/ckpt-consumer-XXXXXX";
    if (!mkdtemp(dir)) {
      std::perror("mkdtemp");
      return 1;
    }
    const std::string path = std::string(dir) + "/model.pt";
    ckpt::save_torch(path, ckpt::state_dict_value(ts), ts);

    bool ok = false;
    {
      ckpt::Checkpoint c = ckpt::Checkpoint::open(path);
      ckpt::Tensor t = c.tensor("layer.weight");
      std::span<const std::byte> b = t.bytes();
      ok = c.tensors().size() == 1 && t.shape() == std::vector<int64_t>{2, 3} &&
           b.size() == sizeof w && std::memcmp(b.data(), w, sizeof w) == 0;
    }
    unlink(path.c_str());
    rmdir(dir);
    if (!ok) {
      std::fprintf(stderr, "consumer: the tensor read back differs\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}

// The series must leave the layout of every engine struct of the torch wheel
// unchanged, or its engine cannot run inside the stock wheel (nor a patched
// build stay ABI-compatible with extensions built for it). `make patch-check`
// compiles and runs this twice, against the wheel's headers alone and with the
// patched tree's include path ahead of them (so a header the series changed
// would be the one measured), and compares the printed sizes. The asserted
// sizes are those of the torch 2.13.0 wheel (x86-64, libstdc++); GraphTask's
// is only compared between the two builds.
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/input_buffer.h>
#include <torch/csrc/autograd/input_metadata.h>
#if __has_include(<torch/csrc/autograd/semiring.h>)
#include <torch/csrc/autograd/semiring.h>
#endif

#include <cstdio>

static_assert(sizeof(torch::autograd::Node) == 464, "Node");
static_assert(sizeof(torch::autograd::AccumulateGrad) == 472, "AccumulateGrad");
static_assert(sizeof(torch::autograd::InputBuffer) == 120, "InputBuffer");
static_assert(sizeof(torch::autograd::InputMetadata) == 96, "InputMetadata");
static_assert(sizeof(torch::autograd::Engine) == 224, "Engine");
static_assert(sizeof(at::ThreadLocalState) == 464, "at::ThreadLocalState");

int main() {
  std::printf("Node %zu AccumulateGrad %zu InputBuffer %zu InputMetadata %zu Engine %zu ThreadLocalState %zu "
              "GraphTask %zu\n",
              sizeof(torch::autograd::Node), sizeof(torch::autograd::AccumulateGrad),
              sizeof(torch::autograd::InputBuffer), sizeof(torch::autograd::InputMetadata),
              sizeof(torch::autograd::Engine), sizeof(at::ThreadLocalState), sizeof(torch::autograd::GraphTask));
}

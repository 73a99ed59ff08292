// What the prefill and decode processes of the multi-process tests (scale_out_peer,
// node_pool_peer) share: the stop flag SIGTERM sets, the requests they are given as "KEY:SEED",
// the prompt rows a seed stands for, the positions a decode step selects, and how they exit on an
// error they cannot go on from.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/control_plane.h"
#include "sparsekv/status.h"
#include "testing/harness.h"

namespace sparsekv::tools::peer {

// Set by OnStop (installed for SIGTERM); the peers' loops end once it is.
extern volatile std::sig_atomic_t stop_requested;
extern "C" void OnStop(int);

struct Request {
  std::string key;
  uint64_t seed = 0;
};

// "KEY:SEED" each; the key may itself hold colons.
std::vector<Request> ParseRequests(const std::vector<std::string>& specs);

// The prompt rows of the request with `seed`: one [tokens][row_bytes] block per layer. Prefill
// writes them, decode's oracle expects them.
std::vector<testing::Bytes> PromptLayers(int32_t layers, int32_t tokens, int32_t row_bytes,
                                         uint64_t seed);

// `top_k` positions of a request of `len` tokens (this step's included) of which `prompt` are
// prompt rows: a run of adjacent prompt positions, a few generated positions, random positions
// anywhere, in random order, then -1 padding.
std::vector<int32_t> PickTopK(std::mt19937_64& rng, int32_t top_k, int32_t prompt, int32_t len);

// Prints "WHAT: STATUS" to stderr and exits 2 unless `s` is ok.
void Check(const Status& s, const std::string& what);

// Connects to the control plane or exits as Check does ("control plane: ...").
std::unique_ptr<ControlPlane> ConnectOrDie(const ControlPlaneOptions& options);

}  // namespace sparsekv::tools::peer

//===- tests/runtime/rank_harness.cpp - Forked ranks and single-process refs ===//
//
// Artifacts through the `apc` binary, the single-process reference and the fork launcher (see
// rank_harness.h).
//
//===----------------------------------------------------------------------===//
#include "rank_harness.h"

#include <ATen/Parallel.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "../common/run_command.h"
#include "apc/frontend/weights.h"
#include "apc/runtime/output_leaves.h"
#include "apc/runtime/parallel_module.h"

namespace apc::runtime::testing {

std::string samplePath(const std::string& model, const std::string& ext) {
  if (!model.empty() && model.front() == '/') return model + "." + ext;  // a test's own model
  return std::string(APC_SOURCE_DIR) + "/sample_models/out/" + model + "." + ext;
}

std::string apcBinary() {
  return std::string(APC_BINARY_DIR) + "/tools/apc";
}

std::string makeArtifact(const ModelCase& c, const std::string& mesh, const std::string& strategy,
                         const std::string& dir, const std::string& extra_flags) {
  std::string cmd = apcBinary() + " plan " + samplePath(c.model, c.format) + " --mesh " + mesh;
  // An exported program's input shapes (its symbolic batch included) come from the export.
  if (c.format == "pt")
    for (const std::string& in : c.inputs) cmd += " --input '" + in + "'";
  if (!strategy.empty()) cmd += " --strategy " + strategy;
  if (strategy.empty() && !c.optimizer_flags.empty()) cmd += " " + c.optimizer_flags;
  if (!extra_flags.empty()) cmd += " " + extra_flags;
  cmd += " -o " + dir + ".plan.json --artifact " + dir;
  apc::testing::CommandResult r = apc::testing::runCommand(cmd);
  if (r.code != 0) return cmd + ": exit " + std::to_string(r.code) + ": " + r.err;
  return "";
}

at::Tensor lossOf(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights) {
  at::Tensor loss;
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor l = (outputs[i] * weights[i]).mean();
    loss = loss.defined() ? loss + l : l;
  }
  return loss;
}

Reference computeReference(const ModelCase& c, int steps, double lr) {
  Reference ref;
  ref.lr = lr;
  torch::jit::Module module = torch::jit::load(samplePath(c.model));
  if (c.format == "pt2") {
    // The ranks start from the exported program's weights; the reference module must hold the
    // same values (the generator writes both files from one model).
    auto state = frontend::loadModelState(samplePath(c.model, "pt2"));
    if (!state.ok()) throw std::runtime_error(state.error().message());
    for (const auto& [name, t] : *state) ref.init[name] = t.detach().clone();
    // Every parameter of the .pt2 is the .pt's (tied ones appear once in the .pt2, under one
    // of their names).
    std::map<std::string, at::Tensor> pt;
    for (const auto& p : module.named_parameters()) pt[p.name] = p.value;
    for (const auto& [name, t] : *state) {
      auto it = pt.find(name);
      if (t.requires_grad() && (it == pt.end() || !at::equal(it->second, t)))
        throw std::runtime_error(c.model + ".pt2 and .pt differ in parameter " + name);
    }
  } else {
    for (const auto& p : module.named_parameters()) ref.init[p.name] = p.value.detach().clone();
    for (const auto& b : module.named_buffers()) ref.init[b.name] = b.value.detach().clone();
  }
  at::Generator gen = at::detail::createCPUGenerator(1234);
  for (const std::string& text : c.inputs) {
    // "name:dtype[d0,d1]"
    size_t colon = text.find(':'), bracket = text.find('[');
    std::string dtype = text.substr(colon + 1, bracket - colon - 1);
    std::vector<int64_t> sizes;
    std::string dims = text.substr(bracket + 1, text.size() - bracket - 2);
    size_t pos = 0;
    while (pos < dims.size()) {
      size_t comma = dims.find(',', pos);
      if (comma == std::string::npos) comma = dims.size();
      std::string d = dims.substr(pos, comma - pos);
      size_t eq = d.find('=');
      sizes.push_back(std::stoll(eq == std::string::npos ? d : d.substr(eq + 1)));
      pos = comma + 1;
    }
    if (dtype == "i64")
      ref.inputs.push_back(at::randint(0, c.index_bound, sizes, gen, at::kLong));
    else
      ref.inputs.push_back(at::randn(sizes, gen, dtype == "f64" ? at::kDouble : at::kFloat));
  }
  std::vector<c10::IValue> args(ref.inputs.begin(), ref.inputs.end());
  for (int step = 0; step < steps; ++step) {
    for (const auto& p : module.parameters()) p.mutable_grad() = at::Tensor();
    std::vector<at::Tensor> outs = outputLeaves(module.forward(args));
    if (step == 0) {
      ref.outputs.clear();
      for (const at::Tensor& o : outs) {
        ref.outputs.push_back(o.detach().clone());
        ref.loss_weights.push_back(at::randn(o.sizes(), gen, o.scalar_type()));
      }
    }
    at::Tensor loss = lossOf(outs, ref.loss_weights);
    ref.losses.push_back(loss.item<double>());
    double scale = 0;
    for (size_t i = 0; i < outs.size(); ++i)
      scale += (outs[i] * ref.loss_weights[i]).abs().mean().item<double>();
    ref.loss_scales.push_back(scale);
    loss.backward();
    at::NoGradGuard no_grad;
    std::vector<const void*> updated;  // tied parameters appear under several names
    for (const auto& p : module.named_parameters()) {
      const void* impl = p.value.unsafeGetTensorImpl();
      bool seen = std::find(updated.begin(), updated.end(), impl) != updated.end();
      at::Tensor g = p.value.grad().defined() ? p.value.grad() : at::zeros_like(p.value);
      if (step == 0) ref.grads[p.name] = g.clone();
      if (seen) continue;
      updated.push_back(impl);
      p.value.sub_(g * lr);
    }
  }
  // Leave the module's weights as they were for other users of the file (nothing shared: the
  // module is local), and the initial copies in ref.init.
  return ref;
}

std::string compareTensors(const at::Tensor& got, const at::Tensor& want, double rtol) {
  if (!got.defined()) return "undefined tensor";
  if (got.sizes() != want.sizes()) {
    std::ostringstream os;
    os << "shape " << got.sizes() << ", expected " << want.sizes();
    return os.str();
  }
  if (want.numel() == 0) return "";
  at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  double scale = w.abs().max().item<double>();
  double diff = (g - w).abs().max().item<double>();
  if (!(diff <= rtol * scale + 1e-30)) {
    std::ostringstream os;
    os << "max |diff| " << diff << " > " << rtol << " * max |expected| " << scale;
    return os.str();
  }
  return "";
}

namespace {

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

}  // namespace

std::vector<std::string> runRanks(int world, const std::function<int(int rank)>& body,
                                  int timeout_s) {
  const int port = freePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", r, e.what());
      }
      std::fflush(stderr);
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> failures;
  std::vector<bool> done(pids.size(), false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      pid_t w = ::waitpid(pids[r], &status, WNOHANG);
      if (w == 0) continue;
      done[r] = true;
      --remaining;
      if (!WIFEXITED(status))
        failures.push_back("rank " + std::to_string(r) + " died (signal " +
                           std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0) + ")");
      else if (WEXITSTATUS(status) != 0)
        failures.push_back("rank " + std::to_string(r) + " exited " +
                           std::to_string(WEXITSTATUS(status)));
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        failures.push_back("rank " + std::to_string(r) + " timed out");
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failures;
}

std::filesystem::path scratchDir(const std::string& test, const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            ("apc_" + test + "_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d.parent_path());
  return d;
}

void RankLog::fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank_, what.c_str());
  ++failures_;
}

std::shared_ptr<ParallelModule> loadRank(const std::string& dir,
                                         const std::map<std::string, at::Tensor>& init,
                                         RankLog& log) {
  return loadRank(dir, init, log, ParallelModuleOptions{});
}

std::shared_ptr<ParallelModule> loadRank(const std::string& dir,
                                         const std::map<std::string, at::Tensor>& init,
                                         RankLog& log, const ParallelModuleOptions& options) {
  at::set_num_threads(1);
  auto loaded = ParallelModule::load(dir, options);
  if (!loaded.ok()) {
    log.fail("load: " + loaded.error().message());
    return nullptr;
  }
  Status st = (*loaded)->load_full_state_dict(init);
  if (!st.ok()) {
    log.fail("load_full_state_dict: " + st.error().message());
    return nullptr;
  }
  return *loaded;
}

std::vector<c10::IValue> shardInputs(const ParallelModule& pm,
                                     const std::vector<at::Tensor>& full) {
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < full.size(); ++i) inputs.emplace_back(pm.shardInput(i, full[i]));
  return inputs;
}

void expectGradsMatch(ParallelModule& pm, const std::map<std::string, at::Tensor>& want,
                      double rtol, RankLog& log) {
  for (size_t i = 0; i < pm.parameterSpecs().size(); ++i) {
    const std::string& name = pm.parameterSpecs()[i].name;
    at::Tensor full = pm.fullGrad(i);
    auto it = want.find(name);
    if (it == want.end()) {
      log.fail("parameter " + name + " is not in the model");
      continue;
    }
    std::string d = compareTensors(full, it->second, rtol);
    if (!d.empty()) log.fail("grad " + name + ": " + d);
  }
}

std::string paramName(std::string text) {
  for (char& ch : text)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return text;
}

int worldOf(const std::string& mesh) {
  int w = 1;
  size_t pos = 0;
  while (pos < mesh.size()) {
    size_t x = mesh.find('x', pos);
    if (x == std::string::npos) x = mesh.size();
    w *= std::stoi(mesh.substr(pos, x - pos));
    pos = x + 1;
  }
  return w;
}

at::Tensor checkedStepLoss(ParallelModule& pm, const std::vector<c10::IValue>& leaves,
                           const Reference& ref, int step, double rtol, RankLog& log) {
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < leaves.size(); ++i)
    outs.push_back(pm.gatherOutput(i, leaves[i].toTensor()));
  if (outs.size() != ref.outputs.size()) {
    log.fail("the program has " + std::to_string(outs.size()) + " output leaves, the model " +
             std::to_string(ref.outputs.size()));
    return {};
  }
  if (step == 0)
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string d = compareTensors(outs[i].detach(), ref.outputs[i], rtol);
      if (!d.empty()) log.fail("output " + std::to_string(i) + ": " + d);
    }
  at::Tensor loss = lossOf(outs, ref.loss_weights);
  const double l = loss.item<double>();
  const auto s = static_cast<size_t>(step);
  if (!(std::abs(l - ref.losses[s]) <= rtol * ref.loss_scales[s] + 1e-12))
    log.fail("step " + std::to_string(step) + " loss " + std::to_string(l) + ", single " +
             std::to_string(ref.losses[s]));
  return loss;
}

}  // namespace apc::runtime::testing

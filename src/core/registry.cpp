// core/registry.cpp — ExpertsInterface: the one table of experts backends.
#include <algorithm>

#include "core/check.hpp"
#include "moex/backend.hpp"

namespace moex {

namespace detail {
// Defined in backends/builtin_backends.cpp: registers the six built-in names.
void register_builtin_backends(ExpertsInterface& registry);
}  // namespace detail

namespace {

// A backend made of user functions.
class FunctionBackend final : public ExpertsBackend {
 public:
  FunctionBackend(std::string name, RunFn run, SupportsFn supports, WorkspaceFn workspace)
      : name_(std::move(name)), run_(std::move(run)), supports_(std::move(supports)), workspace_(std::move(workspace)) {}
  std::string name() const override { return name_; }
  std::string summary() const override { return "user-registered backend"; }
  Support supports(const Problem& p) const override { return supports_ ? supports_(p) : Support::yes(); }
  size_t workspace_bytes(const Problem& p) const override { return workspace_ ? workspace_(p) : 0; }
  void run(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) const override { run_(ex, call, ctx); }

 private:
  std::string name_;
  RunFn run_;
  SupportsFn supports_;
  WorkspaceFn workspace_;
};

}  // namespace

ExpertsInterface::ExpertsInterface() { detail::register_builtin_backends(*this); }

ExpertsInterface& ExpertsInterface::global() {
  static ExpertsInterface instance;
  return instance;
}

void ExpertsInterface::register_backend(std::shared_ptr<const ExpertsBackend> backend) {
  MOEX_CHECK(backend != nullptr, "register_backend: null backend");
  std::string name = backend->name();
  MOEX_CHECK(!name.empty() && name.find_first_of(" ,;\t\n") == std::string::npos,
             "backend name '{}' must be non-empty and contain no spaces, commas or semicolons", name);
  std::lock_guard lock(mu_);
  for (auto& b : backends_) {
    if (b->name() == name) {  // replacing keeps the position in the table
      b = std::move(backend);
      return;
    }
  }
  backends_.push_back(std::move(backend));
}

void ExpertsInterface::register_backend(const std::string& name, RunFn run, SupportsFn supports, WorkspaceFn workspace) {
  MOEX_CHECK(static_cast<bool>(run), "register_backend('{}'): the run function is empty", name);
  register_backend(std::make_shared<FunctionBackend>(name, std::move(run), std::move(supports), std::move(workspace)));
}

bool ExpertsInterface::unregister_backend(std::string_view name) {
  MOEX_CHECK(name != "eager", "the 'eager' backend cannot be unregistered (it is the baseline); register a replacement instead");
  std::lock_guard lock(mu_);
  auto it = std::find_if(backends_.begin(), backends_.end(), [&](auto& b) { return b->name() == name; });
  if (it == backends_.end()) return false;
  backends_.erase(it);
  return true;
}

std::shared_ptr<const ExpertsBackend> ExpertsInterface::get(std::string_view name) const {
  std::lock_guard lock(mu_);
  std::string valid;
  for (auto& b : backends_) {
    if (b->name() == name) return b;
    valid += (valid.empty() ? "" : ", ") + b->name();
  }
  detail::fail(ErrorCode::not_found, "unknown experts backend '{}' (valid: {})", name, valid);
}

bool ExpertsInterface::contains(std::string_view name) const {
  std::lock_guard lock(mu_);
  return std::any_of(backends_.begin(), backends_.end(), [&](auto& b) { return b->name() == name; });
}

std::vector<std::string> ExpertsInterface::names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (auto& b : backends_) out.push_back(b->name());
  return out;
}

Support ExpertsInterface::supports(std::string_view name, const Problem& p) const { return get(name)->supports(p); }

}  // namespace moex

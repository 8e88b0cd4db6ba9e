// `sparrow diff`: run two configurations over the same tokens and report where they first diverge.
#include <cstdio>

#include "common.h"
#include "runtime/backend_factory.h"
#include "runtime/diff.h"
#include "runtime/taps.h"

namespace sparrow::app {

void add_diff_command(CLI::App& app) {
  struct Side {
    std::string model, backend = "cpu";
    ModelRunOptions run;
  };
  struct Opts {
    Side a, b;
    std::string ids, taps = "*", force;
    double tol = 1e-4;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("diff", "Compare every tap of two runs and name the first divergence");
  cmd->add_option("--model-a", opts->a.model, "Checkpoint directory of side A")->required();
  cmd->add_option("--model-b", opts->b.model, "Checkpoint directory of side B (default: A's)");
  for (auto [side, tag] : {std::pair{&opts->a, "a"}, std::pair{&opts->b, "b"}}) {
    const std::string t = tag;
    cmd->add_option("--backend-" + t, side->backend, "Backend of side " + t + ": " + backend_names())
        ->capture_default_str();
    add_model_run_options(cmd, &side->run, "-" + t);
  }
  cmd->add_option("--ids", opts->ids, "Token ids: a .npy file or a list like 1,2,3")->required();
  cmd->add_option("--taps", opts->taps, "Only compare taps matching these globs")->capture_default_str();
  cmd->add_option("--tol", opts->tol, "Value taps diverge past this max|a-b|/max|a|")->capture_default_str();
  cmd->add_option("--force-decisions", opts->force,
                  "'a': side B uses side A's indexer top-k and expert choices, so values compare tightly")
      ->check(CLI::IsMember({"a"}));
  cmd->add_flag("--json", opts->json, "Print the report as JSON");
  cmd->callback([opts] {
    if (opts->b.model.empty()) opts->b.model = opts->a.model;
    auto ids = parse_ids(opts->ids);
    if (!ids.is_ok()) fail(ids.status());
    auto run = [&](const Side& side, const ForcedDecisions* forced) {
      auto backend = make_backend_or_fail(side.backend);
      auto model = Model::load(side.model, model_overrides_or_fail(side.run, side.backend));
      if (!model.is_ok()) fail(model.status());
      // Selections are always recorded: --force-decisions and the set comparison need them.
      const std::string pattern = opts->taps == "*" ? "*" : opts->taps + ",*.indexer.topk,*.router.experts";
      auto records = taps_run(**model, *backend, *ids, pattern, forced);
      if (!records.is_ok()) fail(records.status());
      return std::move(records).value();
    };
    std::vector<TapRecord> a = run(opts->a, nullptr);
    ForcedDecisions forced;
    if (opts->force == "a")
      for (const TapRecord& r : a)
        if (tap_is_selection(r.name)) forced[r.name] = r.i32;
    std::vector<TapRecord> b = run(opts->b, opts->force == "a" ? &forced : nullptr);
    auto keep = [&](std::vector<TapRecord>& v) {
      std::erase_if(v, [&](const TapRecord& r) { return !tap_pattern_match(opts->taps, r.name); });
    };
    keep(a);
    keep(b);
    const DiffReport rep = diff_taps(a, b, {.value_tol = opts->tol});
    std::printf("%s\n", (opts->json ? diff_report_json(rep) : diff_report_text(rep)).c_str());
  });
}

}  // namespace sparrow::app

// llmc/optim/schedule.cpp: implementation of the learning-rate schedules described in schedule.h.
#include "llmc/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "llmc/core/common.h"

namespace llmc {

std::vector<std::string> schedule_names() { return {"cosine", "linear", "constant", "wsd"}; }

// Fraction of the way through a decay phase that runs from step `begin` (ratio 0) to step `last` (ratio 1).
static double decay_ratio(int step, int begin, int last) {
  if (last <= begin) return 1.0;  // a phase of one step ends where it starts
  return std::clamp(double(step - begin) / double(last - begin), 0.0, 1.0);
}

double learning_rate(const std::string& schedule, int step, int total_steps, int warmup_steps, double max_lr,
                     double final_lr_frac, double wsd_decay_frac) {
  const std::vector<std::string> names = schedule_names();
  if (std::find(names.begin(), names.end(), schedule) == names.end())
    throw_error("schedule: unknown learning-rate schedule '%s' in train.schedule (use cosine, linear, constant or wsd)",
                schedule.c_str());
  if (total_steps < 1) throw_error("schedule: train.steps must be at least 1 (got %d)", total_steps);
  if (warmup_steps < 0) throw_error("schedule: train.warmup_steps must be >= 0 (got %d)", warmup_steps);
  if (step < 0) throw_error("schedule: step must be >= 0 (got %d)", step);
  if (!(final_lr_frac >= 0.0 && final_lr_frac <= 1.0))
    throw_error("schedule: train.final_lr_frac must be in [0, 1] (got %g)", final_lr_frac);
  if (!(wsd_decay_frac >= 0.0 && wsd_decay_frac <= 1.0))
    throw_error("schedule: train.wsd_decay_frac must be in [0, 1] (got %g)", wsd_decay_frac);

  if (step < warmup_steps) return max_lr * double(step + 1) / double(warmup_steps);
  if (schedule == "constant") return max_lr;

  const int last = total_steps - 1;
  const double min_lr = final_lr_frac * max_lr;
  if (schedule == "cosine") {
    const double r = decay_ratio(step, warmup_steps, last);
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * r));
  }
  if (schedule == "linear") {
    const double r = decay_ratio(step, warmup_steps, last);
    return min_lr + (max_lr - min_lr) * (1.0 - r);
  }
  // wsd
  const int decay_steps = int(std::lround(wsd_decay_frac * double(total_steps)));
  if (decay_steps == 0) return max_lr;
  const int decay_start = std::max(warmup_steps, total_steps - decay_steps);
  if (step < decay_start) return max_lr;
  const double r = decay_ratio(step, decay_start, last);
  return min_lr + (max_lr - min_lr) * (1.0 - std::sqrt(r));
}

}  // namespace llmc

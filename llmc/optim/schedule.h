// llmc/optim/schedule.h: learning-rate schedules (llm.c's schedulers.h, with the decay ending exactly at the last step).
//
// Every schedule starts with a linear warm-up: lr = max_lr * (step + 1) / warmup_steps for step < warmup_steps.
// After it, with min_lr = final_lr_frac * max_lr and last = total_steps - 1:
//   cosine    min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * r)),  r = (step - warmup) / (last - warmup)
//   linear    min_lr + (max_lr - min_lr) * (1 - r)
//   constant  max_lr
//   wsd       warmup-stable-decay: max_lr until the decay phase, which is the last round(wsd_decay_frac * total_steps)
//             steps (never starting inside the warm-up); in it lr = min_lr + (max_lr - min_lr) * (1 - sqrt(r)),
//             r = (step - decay_start) / (last - decay_start)   (the 1 - sqrt decay of llm.c)
// so cosine / linear / wsd give max_lr on the first step after warm-up and exactly min_lr at step total_steps - 1.
// Steps past the end keep the final value. Invalid arguments or an unknown schedule name → llmc::Error.
#pragma once

#include <string>
#include <vector>

namespace llmc {

double learning_rate(const std::string& schedule /*cosine|linear|constant|wsd*/, int step /*0-based*/, int total_steps,
                     int warmup_steps, double max_lr, double final_lr_frac, double wsd_decay_frac);

// The schedule names accepted by learning_rate.
std::vector<std::string> schedule_names();

}  // namespace llmc

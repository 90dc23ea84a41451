// One pipeline stage as its own process (docs/pipeline.md section 4): the stage's layers and
// optimizer state only, talking to its neighbours over the CURVE transport. Stage i > 0 serves
// (a Server) on `listen`; stage i < S - 1 connects (a Client) to the next stage. Activations go
// forward on that connection as StageData messages, and their gradients come back on it.
//
// Schedules, with B = train.batch_size and the data read by every stage from its own copy (the
// step fixes the sequences, so no stage sends tokens it need not):
//   gpipe  per step: the M micro-batches forward (the last stage computes the loss and sends each
//          gradient back at once), then the M gradients back in order, then one update.
//   async  1F1B without flush: stage i runs the forwards of steps 0 .. S-i-1, then alternates
//          the backward of step k and the forward of step k + S - i. A forward runs at the
//          current weights and stashes them; the backward recomputes the forward at the stashed
//          weights, applies the gradient to the newest ones, and drops the stash. So stage i's
//          step-s gradient is taken at its weights after s - (S-1-i) updates, as in
//          pipeline/simulation.h, and the processes compute the simulation's numbers bit for bit
//          (tested).
// Each stage handles messages in that fixed order whatever order they arrive in (stage_link.h:
// the start handshake, the bound on messages waiting, how failures spread).
//
// Checkpoints and resume: every train.checkpoint_interval steps each stage writes its state
// into `checkpoint_dir` (pipeline/stage_checkpoint.h: weights, optimizer state, and under async
// the stashed forwards and the messages its next stage had not used). With `resume`, the stages
// agree at the start on the newest step every one of them holds, load it and go on; the run
// then ends with the same bits as one never stopped (tested). Without a common step they start
// from the seeded beginning.
//
// Failure: any error, of this stage or a neighbour's, stops this stage with an Error naming the
// stage and what happened; before it stops, it tells both neighbours, which stop at once naming
// the stage that failed first (rather than waiting out their timeouts).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "agora/config/run_config.h"
#include "agora/net/identity.h"

namespace agora::peer {

struct StageOptions {
  int64_t stage = 0;
  std::string listen;                      // stage > 0: where the previous stage connects
  std::string next;                        // stage < S - 1: the next stage's endpoint
  net::PublicKey next_key;                 // ... and its ed25519 key
  std::optional<net::PublicKey> prev_key;  // stage > 0: the previous stage's key (else the first
                                           // to speak; stage_link.h, "Admission")
  std::filesystem::path events;            // JSON lines (start, step, finish), if set
  std::filesystem::path out_dir;           // the stage's checkpoint folder at the end, if set
  std::filesystem::path checkpoint_dir;    // periodic checkpoints (train.checkpoint_interval)
  bool resume = false;                     // start from the newest checkpoint all stages hold
  double timeout_seconds = 60;
  bool progress = true;
};

struct StageSummary {
  int64_t steps = 0;  // run by this process (a resumed run skips those checkpointed)
  double seconds = 0, tokens_per_second = 0;
  double last_loss = 0;        // the last stage's
  std::string parameter_hash;  // hex BLAKE2b of the stage's parameters (hash_tensors)
  int64_t peak_rss_bytes = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
};

// Runs the whole run as stage options.stage of config.pipeline.stages. Throws Error on failure.
StageSummary run_stage(const RunConfig& config, const net::Identity& identity,
                       const StageOptions& options);

}  // namespace agora::peer

/**
 * An example launcher written against the TypeScript SDK: one data-parallel worker of a job,
 * training `model.ts`'s state and taking the controller's orders at every iteration's barrier.
 * `--help` lists its flags.
 *
 *   node dist/cli/demo/worker.js --job llama --host 3 --dp 2 --events DIR --replacement demo-worker
 *
 * For a migration the destination daemon runs this same program as the replacement that its
 * `--replacement demo-worker="node …/worker.js --steps N --events DIR"` names: the job, host and
 * parallelism then come from the MONKEYTREE_* environment and the state from the staging
 * buffer, and the worker carries on at the step its source stopped at.
 */
import { existsSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { intFlag, UsageError } from "../io.ts";
import { helpText, int, list, parseCommandFlags, programOptions, size, str } from "../flags.ts";
import { checkpointCapacity } from "../../sdk/contract/checkpoint/index.ts";
import { DEFAULT_REPORT_INTERVAL_MS, WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { openStagedCheckpoint, replacementFromEnv, sendCheckpoint } from "../../sdk/client/migrate.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
import { appendEvent } from "./events.ts";
import { checkpointItems, digest, initialState, restoreState, seedOf, trainStep, type TrainState } from "./model.ts";

const FLAGS = {
  controller: str("ADDR", "the controller's ZeroMQ address", { default: "tcp://127.0.0.1:5555" }),
  job: str("J", "the job's name; a daemon's replacement takes it, and the group, host and degrees below, from its MONKEYTREE_* environment"),
  group: int("G", "the job's data-parallel group this worker belongs to", { min: 0, default: 0 }),
  host: int("H", "the host this worker runs on", { min: 0 }),
  tp: int("N", "tensor-parallel degree", { min: 1, default: 8 }),
  pp: int("N", "pipeline-parallel degree", { min: 1, default: 1 }),
  dp: int("N", "data-parallel degree", { min: 1, default: 1 }),
  steps: int("N", "iterations to train", { min: 0, default: 40 }),
  "step-ms": int("MS", "shortest iteration, standing in for the GPU time a real step takes", { min: 0, default: 0 }),
  "state-bytes": size("SIZE", "the model and optimizer state to train and move", { default: 64 * 2 ** 20, show: "64MiB" }),
  events: str("DIR", "append this worker's events (resumed, sent, kept, finished) to DIR/J.jsonl"),
  "start-when-exists": str("PATH", "wait for PATH to exist before registering"),
  "pause-at": list("N", "wait before iteration N until the matching --resume-when-exists PATH exists; pairs given again pause again, in order"),
  "resume-when-exists": list("PATH", "the file whose creation ends the matching --pause-at wait"),
  replacement: str("NAME", "the destination daemons' --replacement NAME that starts this program for a migration"),
  "report-ms": int("MS", "how often to report progress, paused or not", { min: 1, default: DEFAULT_REPORT_INTERVAL_MS }),
};

const HELP = helpText({
  command: "node dist/cli/demo/worker.js",
  table: FLAGS,
  about: `One data-parallel worker of a demo job, written against the TypeScript SDK: it trains a
synthetic state and takes the controller's orders at every iteration's barrier. Started by a
daemon as a migration's replacement, it resumes from the staged checkpoint at its source's step.`,
});

interface Pause {
  readonly before: number;
  readonly until: string;
}

/**
 * Lets a scheduler keep a job from training past an iteration until an event of its choosing
 * (in the demo: the controller planned the moves of another job's arrival), whatever the
 * machine's speed.
 */
function pausesOf(at: readonly string[], until: readonly string[]): Pause[] {
  if (at.length !== until.length)
    throw new UsageError("--pause-at N and --resume-when-exists PATH go together: the iteration to wait before, and the file whose creation ends the wait");
  return at.map((raw, i) => ({ before: intFlag("pause-at", raw, undefined, 0), until: until[i]! }));
}

const replacement = replacementFromEnv();
const options = programOptions("demo worker", HELP, (argv) => {
  const flags = parseCommandFlags(argv, FLAGS);
  const job = replacement?.MONKEYTREE_JOB ?? flags.job;
  const host = replacement?.MONKEYTREE_HOST ?? flags.host;
  if (job === undefined || host === undefined) throw new UsageError("--job and --host are required, unless a daemon starts this as a replacement");
  return { flags, job, host, pauses: pausesOf(flags["pause-at"], flags["resume-when-exists"]) };
});
if (options === undefined) process.exit();
const { flags, job, pauses } = options;
const identity = { job, group: replacement?.MONKEYTREE_GROUP ?? flags.group, host: options.host };
const parallelism = {
  tp: replacement?.MONKEYTREE_TP ?? flags.tp,
  pp: replacement?.MONKEYTREE_PP ?? flags.pp,
  dp: replacement?.MONKEYTREE_DP ?? flags.dp,
};
const { steps, "step-ms": stepMs } = flags;
const log = createLogger(`worker ${job}[${identity.group}]@${identity.host}`);
const report = (event: Parameters<typeof appendEvent>[1]) => flags.events !== undefined && appendEvent(flags.events, event);
const who = { ...identity, pid: process.pid };

// A replacement's checkpoint is still on its way when it starts: it registers first, and the
// controller admits it only once the move committed, so the staged bytes are verified by then.
const fresh = replacement ? null : initialState(seedOf(job), flags["state-bytes"]);
const checkpointBytes = replacement ? replacement.MONKEYTREE_STAGING_LENGTH : checkpointCapacity(checkpointItems(fresh!));
const untilExists = async (path: string) => {
  while (!existsSync(path)) await new Promise((resolve) => setTimeout(resolve, 10));
};
// Lets a scheduler admit a job the moment it decides to: the process is loaded and waits.
if (flags["start-when-exists"] !== undefined) await untilExists(flags["start-when-exists"]);
const client = new ControllerClient({ endpoint: replacement?.MONKEYTREE_CONTROLLER ?? flags.controller });
const worker = new WorkerClient(client, identity, parallelism, {
  checkpointBytes,
  reportIntervalMs: flags["report-ms"],
  log,
  ...(flags.replacement === undefined ? {} : { replacement: flags.replacement }),
  ...(replacement ? { token: replacement.MONKEYTREE_TOKEN } : {}),
});
const assignment = await worker.register();

let state: TrainState;
if (replacement) {
  const started = performance.now();
  const staged = openStagedCheckpoint(replacement);
  state = restoreState(staged.view);
  staged.close();
  const loadSeconds = (performance.now() - started) / 1000;
  log.info(() => `loaded migration ${replacement.MONKEYTREE_MIGRATION}'s checkpoint in ${(loadSeconds * 1000).toFixed(0)} ms; resuming at step ${state.step}`);
  report({ ...who, event: "resumed", migration: replacement.MONKEYTREE_MIGRATION, step: state.step, loadSeconds });
} else {
  state = fresh!;
}
if (assignment.resumeStep !== null && assignment.resumeStep + 1 !== state.step) {
  throw new Error(`the job resumes after step ${assignment.resumeStep} but the checkpoint holds step ${state.step}`);
}
log.info(() => `node rank ${assignment.nodeRank} of ${assignment.nodes}, ring ${assignment.ringOrder.join("→")}`);

/** Acts on one barrier's answer; returns false when this worker must exit. */
async function obey(directive: Directive, step: number): Promise<boolean> {
  switch (directive.kind) {
    case "continue":
      return true;
    case "reconfigure":
      log.info(
        () =>
          `re-formed at generation ${directive.assignment.generation}: node rank ${directive.assignment.nodeRank}, ring ${directive.assignment.ringOrder.join("→")}`,
      );
      return true;
    case "stop":
      log.info(() => `stopping: ${directive.reason}`);
      return false;
    case "migrate-out": {
      try {
        const sent = await sendCheckpoint(directive, checkpointItems(state), { bytes: checkpointBytes });
        log.info(
          () =>
            `migration ${directive.migration}: packed in ${(sent.packSeconds * 1000).toFixed(0)} ms, sent ${sent.bytes} bytes to host ${directive.to} in ${(sent.sendSeconds * 1000).toFixed(0)} ms over ${sent.transport}`,
        );
        report({
          ...who,
          event: "sent",
          migration: directive.migration,
          to: directive.to,
          step,
          bytes: sent.bytes,
          packSeconds: sent.packSeconds,
          sendSeconds: sent.sendSeconds,
          transport: sent.transport,
        });
      } catch (error) {
        // The controller learns of the failure from the destination (or its silence) and rolls back.
        log.warn(
          () => `migration ${directive.migration}: the checkpoint did not reach host ${directive.to} (${(error as Error).message}); waiting for the controller`,
        );
      }
      const after = await worker.barrier(step);
      if (after.kind === "continue") report({ ...who, event: "kept", migration: directive.migration, step });
      return obey(after, step);
    }
  }
}

let running = true;
while (running && state.step < steps) {
  for (const pause of pauses) if (state.step === pause.before) await untilExists(pause.until);
  const begun = performance.now();
  trainStep(state);
  const rest = stepMs - (performance.now() - begun);
  if (rest > 0) await new Promise((resolve) => setTimeout(resolve, rest));
  running = await obey(await worker.barrier(state.step - 1), state.step - 1);
}
if (running) report({ ...who, event: "finished", step: state.step, digest: digest(state) });
worker.close();
await client.close();

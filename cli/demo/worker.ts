/**
 * An example launcher written against the TypeScript SDK: one data-parallel worker of a job,
 * training `model.ts`'s state and taking the controller's orders at every iteration's barrier.
 *
 *   node bin/run-ts.js cli/demo/worker.ts --job llama --host 3 --dp 2 --events DIR --replacement demo-worker
 *   node dist/cli/demo/worker.js --job llama --host 3 --dp 2 --events DIR --replacement demo-worker
 *
 * `--replacement` names the destination daemons' command that starts its replacement
 * (`monkeytree daemon --replacement demo-worker="node …/worker.js --steps N --events DIR"`):
 * for a migration the daemon runs this same program, the job, host and parallelism then come
 * from the MONKEYTREE_* environment and the state from the staging buffer, and the worker
 * carries on at the step its source stopped at. `--start-when-exists PATH` holds the start, and
 * `--pause-at N --resume-when-exists PATH` iteration N, until PATH exists (given again, further
 * pauses, each pair in order). It reports every `--report-ms` (default 1,000) throughout,
 * paused or not.
 */
import { existsSync } from "node:fs";
import { parseArgs } from "node:util";
import { performance } from "node:perf_hooks";
import { intFlag } from "../io.ts";
import { checkpointCapacity } from "../../sdk/contract/checkpoint/index.ts";
import { DEFAULT_REPORT_INTERVAL_MS, WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { openStagedCheckpoint, replacementFromEnv, sendCheckpoint } from "../../sdk/client/migrate.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
import { appendEvent } from "./events.ts";
import { checkpointItems, digest, initialState, restoreState, seedOf, trainStep, type TrainState } from "./model.ts";

const { values: flags } = parseArgs({
  options: {
    controller: { type: "string", default: "tcp://127.0.0.1:5555" },
    job: { type: "string" },
    group: { type: "string", default: "0" },
    host: { type: "string" },
    tp: { type: "string", default: "8" },
    pp: { type: "string", default: "1" },
    dp: { type: "string", default: "1" },
    steps: { type: "string", default: "40" },
    "step-ms": { type: "string", default: "0" },
    "state-bytes": { type: "string", default: String(64 * 2 ** 20) },
    events: { type: "string" },
    "start-when-exists": { type: "string" },
    "pause-at": { type: "string", multiple: true },
    "resume-when-exists": { type: "string", multiple: true },
    replacement: { type: "string" },
    "report-ms": { type: "string", default: String(DEFAULT_REPORT_INTERVAL_MS) },
  },
});

const replacement = replacementFromEnv();
const whole = (name: string, raw: string | undefined): number => intFlag(name, raw, undefined, 0);
const job = replacement?.MONKEYTREE_JOB ?? flags.job;
if (job === undefined) throw new Error("--job is required (or start this as a daemon's replacement)");
const identity = {
  job,
  group: replacement?.MONKEYTREE_GROUP ?? whole("group", flags.group),
  host: replacement?.MONKEYTREE_HOST ?? whole("host", flags.host),
};
const parallelism = {
  tp: replacement?.MONKEYTREE_TP ?? whole("tp", flags.tp),
  pp: replacement?.MONKEYTREE_PP ?? whole("pp", flags.pp),
  dp: replacement?.MONKEYTREE_DP ?? whole("dp", flags.dp),
};
const steps = whole("steps", flags.steps);
/** Shortest iteration, standing in for the GPU time a real step takes. */
const stepMs = whole("step-ms", flags["step-ms"]);
/**
 * Lets a scheduler keep a job from training past an iteration until an event of its choosing
 * (in the demo: the controller planned the moves of another job's arrival), whatever the
 * machine's speed.
 */
function pauseFlags(): { readonly before: number; readonly until: string }[] {
  const [at, until] = [flags["pause-at"] ?? [], flags["resume-when-exists"] ?? []];
  if (at.length !== until.length)
    throw new Error("--pause-at N and --resume-when-exists PATH go together: the iteration to wait before, and the file whose creation ends the wait");
  return at.map((raw, i) => ({ before: whole("pause-at", raw), until: until[i]! }));
}
const pauses = pauseFlags();
const log = createLogger(`worker ${job}[${identity.group}]@${identity.host}`);
const report = (event: Parameters<typeof appendEvent>[1]) => flags.events !== undefined && appendEvent(flags.events, event);
const who = { ...identity, pid: process.pid };

// A replacement's checkpoint is still on its way when it starts: it registers first, and the
// controller admits it only once the move committed, so the staged bytes are verified by then.
const fresh = replacement ? null : initialState(seedOf(job), whole("state-bytes", flags["state-bytes"]));
const checkpointBytes = replacement ? replacement.MONKEYTREE_STAGING_LENGTH : checkpointCapacity(checkpointItems(fresh!));
const untilExists = async (path: string) => {
  while (!existsSync(path)) await new Promise((resolve) => setTimeout(resolve, 10));
};
// Lets a scheduler admit a job the moment it decides to: the process is loaded and waits.
if (flags["start-when-exists"] !== undefined) await untilExists(flags["start-when-exists"]);
const client = new ControllerClient({ endpoint: replacement?.MONKEYTREE_CONTROLLER ?? flags.controller });
const worker = new WorkerClient(client, identity, parallelism, {
  checkpointBytes,
  reportIntervalMs: intFlag("report-ms", flags["report-ms"], undefined, 1),
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

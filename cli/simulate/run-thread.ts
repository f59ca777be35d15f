// A simulation thread (see runs.ts): runs each request it is sent, one at a time, and answers
// with its result, or with why it failed. It loads the planner at its first run of a system
// that migrates; requests that arrive meanwhile wait in the port's queue.
import { parentPort } from "node:worker_threads";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { createPlanner, type Planner } from "../../controller/planner/plan/index.ts";
import { systemSpec } from "../../controller/simulator/index.ts";
import { simulateRun, type RunRequest, type ThreadMessage } from "./runs.ts";

const port = parentPort;
if (!port) throw new Error("run-thread runs only as a simulation thread");
let planner: Planner | undefined;
let queue = Promise.resolve();
port.on("message", (request: RunRequest) => {
  queue = queue.then(async () => port.postMessage(await answer(request)));
});

async function answer(request: RunRequest): Promise<ThreadMessage> {
  try {
    if (systemSpec(request.system).migrate) planner ??= await createPlanner();
    return {
      kind: "result",
      result: simulateRun(request, planner, (done) => port!.postMessage({ kind: "progress", index: request.index, done } satisfies ThreadMessage)),
    };
  } catch (error) {
    if (error instanceof InvalidInputError) return { kind: "invalid", index: request.index, source: error.source, issues: error.issues };
    return { kind: "error", index: request.index, message: error instanceof Error ? error.message : String(error) };
  }
}

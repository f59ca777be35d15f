// The planner's worker thread (see plan-thread.ts): loads HiGHS once, says it is ready, then
// answers each plan request with the plan or the planner's error. Requests that arrive while
// HiGHS loads wait in the port's queue.
import { readlinkSync } from "node:fs";
import { setPriority } from "node:os";
import { parentPort } from "node:worker_threads";
import { createPlanner } from "../planner/plan/planner.ts";
import { PLANNER_NICE, PLANNER_READY, type PlanAnswer, type PlanRequest } from "./plan-thread.ts";

const port = parentPort;
if (!port) throw new Error("plan-thread-main runs only as the planner's worker thread");
const planner = await createPlanner();
// When cores are short, the event loop's answers come before the planner's work: on Linux a
// thread has a nice value of its own, and /proc/thread-self names this one. The drop comes only
// after HiGHS has loaded: at nice 19 on a loaded 2-core host, loading it delayed the first plan
// by 13-27 s, against 5-7 s at the controller's priority. Elsewhere, or where /proc is missing,
// the thread keeps the controller's priority.
try {
  setPriority(Number(readlinkSync("/proc/thread-self").split("/").pop()), PLANNER_NICE);
} catch {
  // Not Linux: planning still runs off the event loop, only at the same priority.
}
port.on("message", ({ id, cluster, timeLimitMs }: PlanRequest) => {
  let answer: PlanAnswer;
  try {
    answer = { id, plan: planner.plan(cluster, { timeLimitMs }) };
  } catch (error) {
    answer = { id, error: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(answer);
});
port.postMessage(PLANNER_READY);

// The planner's worker thread (see plan-thread.ts): loads HiGHS once, then answers each plan
// request with the plan or the planner's error. Requests that arrive while HiGHS loads wait
// in the port's queue.
import { parentPort } from "node:worker_threads";
import { createPlanner } from "../plan/planner.ts";
import type { PlanAnswer, PlanRequest } from "./plan-thread.ts";

const port = parentPort;
if (!port) throw new Error("plan-thread-main runs only as the planner's worker thread");
const planner = await createPlanner();
port.on("message", ({ id, cluster, timeLimitMs }: PlanRequest) => {
  let answer: PlanAnswer;
  try {
    answer = { id, plan: planner.plan(cluster, { timeLimitMs }) };
  } catch (error) {
    answer = { id, error: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(answer);
});

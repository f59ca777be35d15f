import { describe, expect, it } from "vitest";
import { PACING_FLAGS, pacingFlags } from "../../cli/controller.ts";
import { parseCommandFlags } from "../../cli/flags.ts";
import { UsageError } from "../../cli/io.ts";
import { DEFAULT_REPLAN_BACKOFF_MS, DEFAULT_STOP_LEAD_STEPS } from "../../controller/service/controller.ts";
import { DEFAULT_TIMEOUTS } from "../../controller/service/migration.ts";
import { DEFAULT_PLAN_TIME_LIMIT_MS } from "../../controller/service/plan-thread.ts";
import { DEFAULT_LOST_JOB_GRACE_MS, DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS } from "../../controller/service/sessions.ts";

const pacing = (...argv: string[]) => pacingFlags(parseCommandFlags(argv, PACING_FLAGS));

describe("the controller's pacing flags", () => {
  it("takes the defaults without flags", () => {
    expect(pacing()).toEqual({
      stopLeadSteps: DEFAULT_STOP_LEAD_STEPS,
      timeouts: DEFAULT_TIMEOUTS,
      replanBackoffMs: DEFAULT_REPLAN_BACKOFF_MS,
      planTimeLimitMs: DEFAULT_PLAN_TIME_LIMIT_MS,
      heartbeatTimeoutMs: 10_000,
      workerHeartbeatTimeoutMs: DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS,
      lostJobGraceMs: DEFAULT_LOST_JOB_GRACE_MS,
    });
  });

  it("reads durations in seconds, the replacement wait as the starting timeout alone", () => {
    const given = pacing("--stop-lead", "3", "--replacement-wait", "2.5", "--replan-backoff", "0", "--heartbeat-timeout", "0.5", "--lost-job-grace", "90");
    expect(given).toMatchObject({ stopLeadSteps: 3, replanBackoffMs: 0, heartbeatTimeoutMs: 500, lostJobGraceMs: 90_000 });
    expect(given.timeouts).toEqual({ ...DEFAULT_TIMEOUTS, starting: 2_500 });
  });

  it("refuses a worker heartbeat timeout that a late report would pass", () => {
    expect(() => pacing("--worker-heartbeat-timeout", "1")).toThrow(UsageError);
    expect(() => pacing("--worker-heartbeat-timeout", "1")).toThrow(/--worker-heartbeat-timeout must be a number from 4 to/);
  });
});

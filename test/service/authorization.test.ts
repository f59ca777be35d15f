import { describe, expect, it } from "vitest";
import { ANYONE, authorize, type Caller } from "../../controller/service/authorization.ts";
import type { Request } from "../../sdk/contract/protocol/codec.ts";
import type { CommandReply } from "../../sdk/contract/protocol/commands.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";

const head = { v: PROTOCOL_VERSION, id: 1 } as const;
const incarnation = "0".repeat(32);
const worker = (job: string) => ({ job, group: 0, host: 3 });
const messages = {
  register: (job: string): Request => ({ ...head, type: "worker.register", worker: worker(job), parallelism: { tp: 1, pp: 1, dp: 2 }, checkpointBytes: 0 }),
  report: (job: string): Request => ({ ...head, type: "worker.report", worker: worker(job), generation: 0, step: 0, stepMs: null, hold: null }),
  finish: (job: string): Request => ({ ...head, type: "job.finish", job }),
  daemon: (host: number): Request => ({ ...head, type: "daemon.register", host, incarnation, stagingBytes: 1, endpoint: "tcp://h:1" }),
  heartbeat: (host: number): Request => ({ ...head, type: "daemon.heartbeat", host, incarnation }),
  result: (host: number): Request => ({ ...head, type: "daemon.transfer-result", host, token: "t", bytes: 1, outcome: "verified" }),
  exited: (host: number): Request => ({ ...head, type: "daemon.replacement-exited", host, migration: "p0/0", token: "t", code: 1, signal: null }),
  prepared: (host: number): CommandReply => ({ ...head, type: "daemon.prepared", host, endpoint: "tcp://h:1", token: "t" }),
  status: (): Request => ({ ...head, type: "status" }),
  events: (): Request => ({ ...head, type: "events", after: 3 }),
};

const jobA: Caller = { role: "job", job: "a" };
const host3: Caller = { role: "daemon", host: 3 };
const operator: Caller = { role: "operator" };
const ruleOf = (caller: Caller, message: Request | CommandReply) => authorize(caller, message)?.rule ?? "allowed";

describe("authorize", () => {
  it("lets a job credential register, report and finish its own job only", () => {
    for (const message of [messages.register, messages.report, messages.finish]) {
      expect(ruleOf(jobA, message("a"))).toBe("allowed");
      expect(ruleOf(jobA, message("b"))).toBe("job-credential-own-job");
      expect(ruleOf(host3, message("a"))).toBe("job-credential-own-job");
    }
  });

  it("lets an operator finish any job, but never register or report a job's workers", () => {
    expect(ruleOf(operator, messages.finish("a"))).toBe("allowed");
    expect(ruleOf(operator, messages.finish("b"))).toBe("allowed");
    expect(ruleOf(operator, messages.register("a"))).toBe("job-credential-own-job");
    expect(ruleOf(operator, messages.report("a"))).toBe("job-credential-own-job");
    expect(authorize(host3, messages.finish("a"))?.message).toContain("an operator's may finish any");
  });

  it("lets a daemon credential speak for its own host only, its answers to commands included", () => {
    for (const message of [messages.daemon, messages.heartbeat, messages.result, messages.exited, messages.prepared]) {
      expect(ruleOf(host3, message(3))).toBe("allowed");
      expect(ruleOf(host3, message(4))).toBe("daemon-credential-own-host");
      expect(ruleOf(jobA, message(3))).toBe("daemon-credential-own-host");
    }
  });

  it("keeps status and the event log to operators", () => {
    for (const message of [messages.status(), messages.events()]) {
      expect(ruleOf(operator, message)).toBe("allowed");
      expect(ruleOf(jobA, message)).toBe("status-needs-operator");
      expect(ruleOf(host3, message)).toBe("status-needs-operator");
    }
    expect(authorize(jobA, messages.events())?.message).toMatch(/^events needs an operator credential/);
  });

  it("lets anyone do anything on a controller without a keyring", () => {
    for (const message of [messages.register("b"), messages.finish("b"), messages.daemon(4), messages.prepared(4), messages.status(), messages.events()]) {
      expect(ruleOf(ANYONE, message)).toBe("allowed");
    }
  });

  it("names the rule, the message, the job and the credential in its refusal", () => {
    expect(authorize(jobA, messages.finish("b"))?.message).toBe(
      'job.finish for job "b" needs that job\'s credential, and this is job "a"\'s credential; a job credential may register, report and finish only its own job, and an operator\'s may finish any',
    );
  });
});

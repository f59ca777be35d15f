import type { Cluster } from "../../controller/planner/model/cluster.ts";
import type { Plan } from "../../controller/planner/plan/planner.ts";
import type { PlanRunner } from "../../controller/service/plan-thread.ts";
import { DaemonCommandError } from "../../controller/service/daemon-hosts.ts";
import type {
  HostScheduler,
  SchedulerView,
  ReplacementLauncher,
  ReplacementRequest,
  StagingGrant,
  StagingRequest,
  StagingTransport,
} from "../../controller/service/transport.ts";

/**
 * Test double for the hosts' side of a migration: grants staging in process (or refuses it
 * for hosts listed in `refuse`) and records what the controller asked for. The real
 * transport is the per-host daemon with the native transfer engine.
 */
export class RecordingHosts implements StagingTransport, ReplacementLauncher {
  readonly prepared: StagingRequest[] = [];
  readonly released: { host: number; token: string }[] = [];
  readonly spawned: ReplacementRequest[] = [];
  readonly refuse = new Set<number>();
  /** Hosts whose next release goes unanswered, as a daemon cut off from the controller's does. */
  readonly unanswered = new Set<number>();
  private waiters: (() => void)[] = [];

  prepare(request: StagingRequest): Promise<StagingGrant> {
    this.prepared.push(request);
    this.notify();
    if (this.refuse.has(request.host)) return Promise.reject(new Error(`host ${request.host} refuses staging`));
    return Promise.resolve({ endpoint: `inproc://staging-${request.host}`, token: `token-${request.migration}` });
  }

  release(host: number, token: string): Promise<void> {
    this.released.push({ host, token });
    this.notify();
    if (this.unanswered.delete(host))
      return Promise.reject(new DaemonCommandError("timeout", host, `the daemon on host ${host} did not answer daemon.release`));
    return Promise.resolve();
  }

  spawn(request: ReplacementRequest): Promise<void> {
    this.spawned.push(request);
    this.notify();
    return Promise.resolve();
  }

  /** Resolves once `ready()` holds, checking after every recorded call. */
  async until(ready: () => boolean, timeoutMs = 5_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!ready()) {
      if (Date.now() > deadline) throw new Error("timed out waiting for the hosts double");
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 50);
      });
    }
  }

  private notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }
}

/** What the double's jobs a and b were allocated: their workers register only there. */
export const ALLOCATIONS = [
  { job: "a", hosts: [0, 1, 4, 5] },
  { job: "b", hosts: [1, 2, 5] },
];

/**
 * Test double for the scheduler that owns the hosts (Slurm's adapter in production): records
 * every call, in order, beside the hosts' calls in `log`, and refuses holds on `refuse`.
 */
export class RecordingScheduler implements HostScheduler {
  readonly calls: string[] = [];
  readonly refuse = new Set<number>();
  /** What `view()` answers; a test changes it as the cluster would change. */
  current: SchedulerView = { pinned: [], unavailable: [], holds: [], live: [], allocations: ALLOCATIONS };
  /** Set to keep `view()` from answering until the test calls `answer()`. */
  private waiting: (() => void)[] | null = null;

  constructor(private readonly log: string[] = []) {}

  /** How many times the controller looked. */
  looks = 0;

  view(): Promise<SchedulerView> {
    this.looks++;
    if (!this.waiting) return Promise.resolve(this.current);
    return new Promise((resolve) => this.waiting!.push(() => resolve(this.current)));
  }

  /** From now on `view()` waits for `answer()`. */
  silence(): void {
    this.waiting = [];
  }

  answer(): void {
    const waiting = this.waiting ?? [];
    this.waiting = null;
    for (const resolve of waiting) resolve();
  }

  /** A granted hold shows in the next view, as the scheduler's would. */
  hold(job: string, migration: string, host: number): Promise<void> {
    this.record(`hold ${job} ${migration} host ${host}`);
    if (this.refuse.has(host)) return Promise.reject(new Error(`host ${host} is reserved for maintenance`));
    const name = `${job}-${migration}`;
    if (!this.current.holds.some((h) => h.name === name))
      this.current = { ...this.current, holds: [...this.current.holds, { name, job, node: `n${host}`, host }] };
    return Promise.resolve();
  }

  release(job: string, migration: string): Promise<void> {
    this.record(`release ${job} ${migration}`);
    this.current = { ...this.current, holds: this.current.holds.filter((h) => h.name !== `${job}-${migration}`) };
    return Promise.resolve();
  }

  giveBack(job: string, host: number): Promise<void> {
    this.record(`give back ${job} host ${host}`);
    return Promise.resolve();
  }

  private record(call: string): void {
    this.calls.push(call);
    this.log.push(call);
  }
}

/** The real planner thread, watched: whether a plan is in flight, and how many were asked for. */
export class Watched implements PlanRunner {
  inFlight = false;
  asked = 0;
  constructor(private readonly inner: PlanRunner) {}
  plan(cluster: Cluster, timeLimitMs: number): Promise<Plan> {
    this.inFlight = true;
    this.asked++;
    return this.inner.plan(cluster, timeLimitMs).finally(() => (this.inFlight = false));
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/** The real planner thread, whose answers reach the controller only when the test says so. */
export class Gated implements PlanRunner {
  readonly asked: { readonly cluster: Cluster; readonly release: () => void }[] = [];
  constructor(private readonly inner: PlanRunner) {}
  plan(cluster: Cluster, timeLimitMs: number): Promise<Plan> {
    const computed = this.inner.plan(cluster, timeLimitMs);
    // A plan the test never releases fails when the controller closes; nobody waits for it.
    computed.catch(() => {});
    return new Promise((resolve, reject) => this.asked.push({ cluster, release: () => void computed.then(resolve, reject) }));
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/** The real planner thread told nothing of pinned jobs and unavailable hosts: a planner that does not honour them. */
export class Heedless implements PlanRunner {
  constructor(private readonly inner: PlanRunner) {}
  plan(cluster: Cluster, timeLimitMs: number): Promise<Plan> {
    return this.inner.plan({ ...cluster, unavailable: [], groups: cluster.groups.map((g) => ({ ...g, movable: true })) }, timeLimitMs);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/** A planner with a bug: every move of its plan is sent twice in the same step. */
export class Doubling implements PlanRunner {
  constructor(private readonly inner: PlanRunner) {}
  async plan(cluster: Cluster, timeLimitMs: number): Promise<Plan> {
    const plan = await this.inner.plan(cluster, timeLimitMs);
    return { ...plan, moves: plan.moves.flatMap((m) => [m, { ...m }]) };
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

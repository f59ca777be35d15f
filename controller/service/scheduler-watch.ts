import type { Job } from "../planner/model/snapshot.ts";
import type { ControllerContext } from "./context.ts";
import type { Allocations } from "./sessions.ts";
import type { DurableState } from "./state.ts";
import type { HostScheduler, SchedulerView } from "./transport.ts";

/**
 * The controller's look at the cluster's scheduler: it polls `view()` every `pollMs` (one
 * look at a time), keeps the latest, and asks for a plan when what it says changed. Until the
 * first look arrives the cluster is unknown, so nothing is planned; the first look only lets a
 * plan that was already due go ahead (after a restart, that waits out the replan backoff).
 * It tells worker registrations which hosts each job was allocated.
 */
export class SchedulerWatch implements Allocations {
  private latest: SchedulerView | null = null;
  private polling = false;
  private lastPoll = -Infinity;
  private lastError: string | null = null;
  /** Holds asked for and not answered yet, as `job:host`. */
  private readonly holding = new Set<string>();
  /** Told once the next look that starts arrives; and those told once the look in flight does. */
  private wanted = new Set<() => void>();
  private inFlight: (() => void)[] = [];
  private allocated = new Map<string, ReadonlySet<number>>();

  constructor(
    private readonly context: ControllerContext,
    private readonly scheduler: HostScheduler,
    private readonly pollMs: number,
    /** `first`: the first look, which changes nothing that was known. */
    private readonly changed: (first: boolean) => void,
    /** The scheduler no longer runs this started job (it ended, or was cancelled). */
    private readonly ended: (job: string) => void,
  ) {}

  get view(): SchedulerView | null {
    return this.latest;
  }

  of(job: string): ReadonlySet<number> | undefined {
    return this.allocated.get(job);
  }

  lookAgain(then: () => void): void {
    this.wanted.add(then);
  }

  /** Called on every tick: starts a look when the last is `pollMs` old, or one was asked for, and none is in flight. */
  tick(now: number): void {
    if (this.polling || (now - this.lastPoll < this.pollMs && this.wanted.size === 0)) return;
    this.polling = true;
    this.lastPoll = now;
    this.inFlight = [...this.wanted];
    this.wanted.clear();
    this.scheduler.view().then(
      (view) => this.context.safely("reading the scheduler's view", () => this.update(view)),
      (error: unknown) => {
        this.polling = false;
        // Asked for again at the next look: a scheduler that did not answer says nothing of any job.
        for (const then of this.inFlight) this.wanted.add(then);
        const text = error instanceof Error ? error.message : String(error);
        // A scheduler that stays down is reported once, not every few seconds.
        if (text !== this.lastError) this.context.log.warn(() => `the scheduler did not answer; keeping its last view: ${text}`);
        this.lastError = text;
      },
    );
  }

  private update(view: SchedulerView): void {
    this.polling = false;
    this.lastError = null;
    const before = this.latest;
    this.latest = view;
    this.allocated = new Map(view.allocations.map((a) => [a.job, new Set(a.hosts)]));
    // Only jobs seen running (by this controller or, journaled, by an earlier one): a
    // MonkeyTree job the scheduler never ran is not its to end.
    const live = new Set(view.live);
    for (const job of [...this.context.state.jobs.values()]) {
      if (live.has(job.id)) {
        if (!job.scheduled) this.context.record({ kind: "job-scheduled", job: job.id });
      } else if (job.scheduled) this.ended(job.id);
    }
    this.keepHolds(view);
    if (!before || key(before) !== key(view)) this.changed(before === null);
    const told = this.inFlight;
    this.inFlight = [];
    for (const then of told) then();
  }

  /**
   * Every host a running job's worker was moved to lies outside its allocation, and only a
   * hold keeps the scheduler from starting another job there. A hold can be lost (slurmctld
   * drops a reservation made in the second before it crashes), so each look holds again any
   * such host that no hold of the job covers. Only hosts its own moves brought it to: a host
   * its allocation lost otherwise (its user shrank the job) is never held for it.
   */
  private keepHolds(view: SchedulerView): void {
    const allocated = new Map(view.allocations.map((a) => [a.job, new Set(a.hosts)]));
    const held = new Set(view.holds.map((h) => `${h.job}:${h.host}`));
    for (const job of this.context.state.jobs.values()) {
      const allocation = allocated.get(job.id);
      if (!allocation || !job.scheduled) continue;
      for (const host of job.movedTo) {
        const key = `${job.id}:${host}`;
        if (allocation.has(host) || held.has(key) || this.holding.has(key)) continue;
        this.holding.add(key);
        this.context.log.warn(() => `host ${host} of job ${job.id} lies outside its allocation and no hold covers it: holding it again`);
        this.scheduler
          .hold(job.id, `keep-${host}`, host)
          .catch((error: unknown) =>
            this.context.log.warn(() => `holding host ${host} for job ${job.id}: ${error instanceof Error ? error.message : String(error)}`),
          )
          .finally(() => this.holding.delete(key));
      }
    }
  }
}

/** Only what the planner sees: the pinned jobs and the unavailable hosts. */
const key = (view: SchedulerView): string => JSON.stringify([view.pinned, view.unavailable.map((u) => u.host)]);

/**
 * The scheduler's pinned jobs as snapshot jobs beside MonkeyTree's own: never moved, counted
 * where they run. A host MonkeyTree's own job holds is left out of them, and so is a job
 * MonkeyTree knows by the same id (its launchers registered since the last look).
 */
export function pinnedJobs(state: DurableState, view: SchedulerView | null): Job[] {
  if (!view) return [];
  const ours = new Set([...state.jobs.values()].flatMap((job) => job.groups.flat()));
  return view.pinned.flatMap((job) => {
    if (state.jobs.has(job.id)) return [];
    const hosts = job.hosts.filter((h) => !ours.has(h));
    return hosts.length ? [{ id: job.id, rings: job.rings, hosts, movable: false }] : [];
  });
}

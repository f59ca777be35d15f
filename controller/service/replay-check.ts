import { isCommitted, isReversible } from "./migration.ts";
import type { DurableState, JournalRecord } from "./state.ts";

/**
 * What replay checks beyond a record's checksum and schema: that its hosts exist and that it
 * fits the state the records before it built. The controller journals only records it has
 * checked against its state, so one that fails here was not written by it (damage the
 * checksum missed, or an edit), and applying it would put a lie into the state: two jobs on
 * one host, or a host every later `status` fails to route. `after` is `record` applied to
 * `before`. Returns what is wrong, or null.
 */
export function misfit(before: DurableState, record: JournalRecord, after: DurableState): string | null {
  const hostCount = before.topology.racks * before.topology.hostsPerRack;
  const outOfRange = (hosts: Iterable<number>, what: string): string | null => {
    for (const h of hosts) if (h >= hostCount) return `${what} host ${h} is out of range: the cluster has hosts 0..${hostCount - 1}`;
    return null;
  };
  switch (record.kind) {
    case "config":
    case "job-finished":
    case "job-scheduled":
      return null;
    case "job-started": {
      const hosts = record.groups.flat();
      const duplicate = hosts.find((h, i) => hosts.indexOf(h) !== i);
      if (duplicate !== undefined) return `job "${record.job}" lists host ${duplicate} twice`;
      return outOfRange(hosts, `job "${record.job}":`) ?? sharedHost(before, record.job, hosts, false);
    }
    case "plan":
      return outOfRange(
        record.moves.flatMap((m) => [m.from, m.to]),
        `plan ${record.plan}:`,
      );
    case "migration": {
      const m = record.migration;
      const planned = before.migrations.get(m.id);
      if (!planned) return null; // `applyRecord` refuses it
      for (const key of ["job", "group", "from", "to", "planStep"] as const) {
        if (m[key] !== planned[key]) return `migration ${m.id} has ${key} ${JSON.stringify(m[key])}, but was planned with ${JSON.stringify(planned[key])}`;
      }
      return !isCommitted(planned.state) && isCommitted(m.state) ? sharedHost(before, m.job, [m.to], true) : null;
    }
    case "snapshot":
      for (const job of after.jobs.values()) {
        const problem = outOfRange(job.groups.flat(), `job "${job.id}":`) ?? sharedHost(after, job.id, job.groups.flat(), true);
        if (problem) return problem;
      }
      return outOfRange(
        [...after.migrations.values()].flatMap((m) => [m.from, m.to]),
        "migration",
      );
  }
}

/**
 * A host among `hosts` that a job other than `job` runs on. With `swapping`, a host one of the
 * two is moving off in the active plan does not count: a swap commits one move before the other.
 */
function sharedHost(state: DurableState, job: string, hosts: readonly number[], swapping: boolean): string | null {
  const leaving = new Set<string>();
  if (swapping) {
    for (const id of state.activeMoves) {
      const m = state.migrations.get(id);
      if (m && isReversible(m.state)) leaving.add(`${m.job}@${m.from}`);
    }
  }
  const wanted = new Set(hosts);
  for (const other of state.jobs.values()) {
    if (other.id === job) continue;
    for (const h of other.groups.flat()) {
      if (wanted.has(h) && !leaving.has(`${other.id}@${h}`) && !leaving.has(`${job}@${h}`)) return `host ${h} is already job "${other.id}"'s`;
    }
  }
  return null;
}

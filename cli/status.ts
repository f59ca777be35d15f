import { ClientClosedError, ControllerClient, ControllerError, ControllerTimeoutError } from "../sdk/client/client.ts";
import { assertNever } from "../controller/service/migration.ts";
import type { ControllerEvent } from "../sdk/contract/protocol/events.ts";
import type { StatusReport } from "../sdk/contract/protocol/status.ts";
import type { ControllerRefusedError } from "../sdk/client/connection.ts";
import type { Credential } from "../sdk/contract/protocol/auth.ts";
import { bool, checked, helpText, parseCommandFlags, seconds, str } from "./flags.ts";
import { CREDENTIALS_ENV, ExitCode, addressFlag, credentialFlag, refusalAdvice, table, writeJson, type Command, type Io } from "./io.ts";

/** The flags of the commands that ask a running controller something; `credential` says whose credential they take. */
export const controllerFlags = (credential: string) =>
  ({
    connect: checked("ADDR", "controller address", (value, name) => addressFlag(`--${name}`, value, "connect"), { default: "tcp://127.0.0.1:5555" }),
    credentials: str("FILE", `${credential}, required when the controller has a keyring; default $${CREDENTIALS_ENV}`),
    timeout: seconds("S", "give up after S seconds", { default: 5, min: 0.1 }),
  }) as const;

const FLAGS = {
  ...controllerFlags("an operator credential (operator-NAME.json from `monkeytree keys`)"),
  json: bool("print the status document as JSON; with --follow, each event as its JSON line"),
  follow: bool("stream the controller's events, one line each"),
};

const help = helpText({
  command: "monkeytree status",
  table: FLAGS,
  about: `Asks a running controller what it holds: jobs and their workers (a job's \`lost\` column
lists the hosts whose launcher fell silent), host daemons, per-rack fragmentation against
the bound, and every migration with its state; under a cluster scheduler (Slurm), also the
jobs it counts but never moves, the hosts no worker may move to, and the holds that keep its
destinations. With --follow, streams the controller's decisions instead (its event log: a
job seen, fragmentation found, a plan, each move's transitions, a rollback and why, a worker
or a daemon lost), starting with the latest few, until SIGINT or SIGTERM.`,
  after: `exit codes: 0 within bounds (with --follow: stopped by a signal), 1 some rack is over its
bound, 2 bad usage, 3 no answer, or a refusal.`,
});

/** How often a follower asks for new events when there were none. */
const FOLLOW_POLL_MS = 250;

/**
 * A client of the controller at `endpoint` that closes itself when the controller refuses its
 * handshake, which ends any wait at once; `refused()` then says why (else undefined).
 */
export function operatorClient(
  endpoint: string,
  credential: Credential | undefined,
  timeoutMs: number,
): { client: ControllerClient; refused: () => ControllerRefusedError | undefined } {
  let refused: ControllerRefusedError | undefined;
  const client = new ControllerClient({
    endpoint,
    ...(credential ? { credential } : {}),
    timeoutMs,
    onRefused: (error) => {
      refused = error;
      void client.close();
    },
  });
  return { client, refused: () => refused };
}

export const command: Command = {
  summary: "show a running controller's jobs, hosts and migrations",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const credential = credentialFlag(flags.credentials);
    const { client, refused: refusal } = operatorClient(flags.connect, credential?.credential, flags.timeout);
    try {
      return await (flags.follow ? follow(client, io, flags.json) : report(client, io, flags.json));
    } catch (error) {
      const refused = refusal();
      if (!(refused && error instanceof ClientClosedError)) throw error;
      io.err.write(`monkeytree status: ${refusalAdvice(refused, credential?.path, "the operator-NAME.json that `monkeytree keys --operator NAME` wrote")}\n`);
      // As for a request the controller refused.
      return ExitCode.internal;
    }
  },
};

/** Prints the controller's status once. */
async function report(client: ControllerClient, io: Io, json: boolean): Promise<ExitCode> {
  let status: StatusReport;
  try {
    status = await client.status();
  } catch (error) {
    if (error instanceof ControllerTimeoutError || error instanceof ControllerError) {
      io.err.write(`monkeytree status: ${error.message}\n`);
      return ExitCode.internal;
    }
    throw error;
  } finally {
    await client.close();
  }
  if (json) await writeJson(io, status);
  else io.out.write(`${renderStatus(status)}\n`);
  return status.withinBounds ? ExitCode.ok : ExitCode.findings;
}

/**
 * Prints events as they come until SIGINT or SIGTERM, which close the client and end the
 * wait at once. A controller that stops answering ends it with exit code 3, saying so.
 */
async function follow(client: ControllerClient, io: Io, json: boolean): Promise<ExitCode> {
  const stopped = new AbortController();
  const stop = () => {
    stopped.abort();
    void client.close();
  };
  process.once("SIGINT", stop).once("SIGTERM", stop);
  let after: number | undefined;
  try {
    while (!stopped.signal.aborted) {
      const batch = await client.events(after);
      if (batch.missed > 0)
        io.err.write(`monkeytree status: ${batch.missed} events went by faster than they were read; events.jsonl beside the controller's journal has them\n`);
      for (const event of batch.events) io.out.write(`${json ? JSON.stringify(event) : describeEvent(event)}\n`);
      // A controller started afresh numbers its events from 1 again.
      after = batch.events.at(-1)?.seq ?? (after === undefined || batch.last < after ? batch.last : after);
      if (batch.events.length === 0) await sleep(FOLLOW_POLL_MS, stopped.signal);
    }
    return ExitCode.ok;
  } catch (error) {
    if (stopped.signal.aborted && error instanceof ClientClosedError) return ExitCode.ok;
    if (error instanceof ControllerTimeoutError) {
      io.err.write(`monkeytree status: the controller is unreachable: ${error.message}\n`);
      return ExitCode.internal;
    }
    if (error instanceof ControllerError) {
      io.err.write(`monkeytree status: ${error.message}\n`);
      return ExitCode.internal;
    }
    throw error;
  } finally {
    process.off("SIGINT", stop).off("SIGTERM", stop);
    await client.close();
  }
}

/** Waits `ms` or until `signal` aborts; either way the abort listener goes, so polling adds none. */
export const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });

/** One event as a line for people: the controller's time, then what happened. */
export function describeEvent(event: ControllerEvent): string {
  const time = new Date(event.at).toISOString().slice(11, 23);
  return `${time}  ${whatHappened(event)}`;
}

function whatHappened(e: ControllerEvent): string {
  switch (e.event) {
    case "job-started":
      return `job ${e.job} started on hosts ${e.hosts.join(", ")} (${e.rings} rings)`;
    case "job-finished":
      return `job ${e.job} finished`;
    case "fragmentation":
      return `fragmentation over λ ${e.lambda} on rack${e.over.length === 1 ? "" : "s"} ${e.over.join(", ")}: rings per rack ${e.racks.join(" ")}`;
    case "plan":
      return `plan ${e.plan ?? "(none)"}: ${e.status}, ${e.moves} move${e.moves === 1 ? "" : "s"} in ${e.steps} step${e.steps === 1 ? "" : "s"} (${(e.seconds * 1000).toFixed(1)} ms)`;
    case "plan-failed":
      return `planning failed: ${e.reason}`;
    case "move":
      return `move ${e.migration} (${e.job}, host ${e.source} → ${e.destination}): ${e.from} → ${e.to}`;
    case "rollback":
      return `move ${e.migration} (${e.job}) rolled back: ${e.reason}`;
    case "alert":
      return `ALERT move ${e.migration} (${e.job}) failed after commit and stands: ${e.reason}`;
    case "daemon-lost":
      return `daemon on host ${e.host} lost: no heartbeat for ${e.silentMs} ms`;
    case "worker-lost":
      return `worker of job ${e.job} on host ${e.host} lost: no word from its launcher for ${e.silentMs} ms`;
    default:
      return assertNever(e);
  }
}

/** The status document for people. A job's `lost` column lists the hosts whose worker's launcher fell silent. */
export function renderStatus(report: StatusReport): string {
  const t = report.topology;
  const over = report.fragmentation.flatMap((d, rack) => (d > report.lambda ? [rack] : []));
  const lostWorkers = report.jobs.reduce((sum, j) => sum + (j.lost?.length ?? 0), 0);
  const lines = [
    `${t.racks} racks × ${t.hostsPerRack} hosts × ${t.gpusPerHost} GPUs, λ ${report.lambda}; ` +
      `${report.jobs.length} jobs, ${report.workers} workers${lostWorkers ? ` (${lostWorkers} lost)` : ""}, ${report.hosts.registered} host daemons` +
      (report.hosts.lost.length ? ` (lost: ${report.hosts.lost.join(", ")})` : ""),
    report.withinBounds ? "every rack is within its bound" : `racks over the bound: ${over.join(", ")}`,
    report.routes.isolated
      ? `routes: every DP flow has its own links (${report.routes.dpFlows} DP flows)`
      : `routes: up to ${report.routes.maxFlowsPerLink} DP flows share a link`,
    `journal: ${report.journalRecords} records`,
  ];
  if (report.jobs.length) {
    lines.push(
      "",
      table(
        ["job", "workers", "expected", "started", "generation", "hosts", "lost"],
        report.jobs.map((j) => [j.id, j.hosts.length, j.expected, j.started ? "yes" : "no", j.generation, j.hosts.join(" "), j.lost?.join(" ") ?? "-"]),
      ),
    );
  }
  const scheduler = report.scheduler;
  if (scheduler) {
    lines.push("", `scheduler: ${scheduler.pinned.length} pinned jobs, ${scheduler.unavailable.length} unavailable hosts, ${scheduler.holds.length} holds`);
    if (scheduler.pinned.length)
      lines.push(
        table(
          ["pinned job", "rings", "hosts"],
          scheduler.pinned.map((j) => [j.id, j.rings, j.hosts.join(" ")]),
        ),
      );
    if (scheduler.unavailable.length)
      lines.push(
        table(
          ["unavailable", "why"],
          scheduler.unavailable.map((u) => [u.host, u.why]),
        ),
      );
    if (scheduler.holds.length)
      lines.push(
        table(
          ["hold", "job", "node"],
          scheduler.holds.map((h) => [h.name, h.job, h.node]),
        ),
      );
  }
  if (report.migrations.length) {
    lines.push(
      "",
      table(
        ["migration", "job", "group", "from", "to", "step", "state", "barrier", "reason"],
        report.migrations.map((m) => [m.id, m.job, m.group, m.from, m.to, m.planStep, m.state, m.stopStep ?? "-", m.reason ?? ""]),
      ),
    );
  }
  return lines.join("\n");
}

import { ControllerClient, ControllerError, ControllerTimeoutError } from "../sdk/client.ts";
import type { StatusReport } from "../sdk/protocol/status.ts";
import { CREDENTIALS_ENV, ExitCode, credentialFlag, numberFlag, parseFlags, table, writeJson, type Command } from "./io.ts";

const help = `usage: monkeytree status [--connect ADDR] [--credentials FILE] [--timeout S] [--json]

Asks a running controller what it holds: jobs and their workers, host daemons, per-rack
fragmentation against the bound, and every migration with its state; under a cluster
scheduler (Slurm), also the jobs it counts but never moves, the hosts no worker may move to,
and the holds that keep its destinations.

options:
  --connect ADDR    controller address (default tcp://127.0.0.1:5555)
  --credentials FILE  an operator credential (operator-NAME.json from \`monkeytree keys\`),
                    required when the controller has a keyring; default $${CREDENTIALS_ENV}
  --timeout S       give up after S seconds (default 5)
  --json            print the status document as JSON
  -h, --help        show this help

exit codes: 0 within bounds, 1 some rack is over its bound, 2 bad usage, 3 no answer.`;

export const command: Command = {
  summary: "show a running controller's jobs, hosts and migrations",
  help,
  async run(argv, io) {
    const flags = parseFlags(argv, {
      connect: { type: "string" },
      credentials: { type: "string" },
      timeout: { type: "string" },
      json: { type: "boolean" },
    });
    const timeoutMs = numberFlag("timeout", flags.timeout, 5, 0.1) * 1000;
    const endpoint = flags.connect ?? "tcp://127.0.0.1:5555";
    const credential = credentialFlag(flags.credentials);
    const client = new ControllerClient({ endpoint, ...(credential ? { credential: credential.credential } : {}), timeoutMs });
    let report: StatusReport;
    try {
      report = await client.status();
    } catch (error) {
      if (error instanceof ControllerTimeoutError || error instanceof ControllerError) {
        io.err.write(`monkeytree status: ${error.message}\n`);
        return ExitCode.internal;
      }
      throw error;
    } finally {
      await client.close();
    }
    if (flags.json) await writeJson(io, report);
    else io.out.write(`${render(report)}\n`);
    return report.withinBounds ? ExitCode.ok : ExitCode.findings;
  },
};

function render(report: StatusReport): string {
  const t = report.topology;
  const over = report.fragmentation.flatMap((d, rack) => (d > report.lambda ? [rack] : []));
  const lines = [
    `${t.racks} racks × ${t.hostsPerRack} hosts × ${t.gpusPerHost} GPUs, λ ${report.lambda}; ` +
      `${report.jobs.length} jobs, ${report.workers} workers, ${report.hosts.registered} host daemons` +
      (report.hosts.lost.length ? ` (lost: ${report.hosts.lost.join(", ")})` : ""),
    report.withinBounds ? "every rack is within its bound" : `racks over the bound: ${over.join(", ")}`,
    report.routes.isolated
      ? `routes: every DP flow has its own links (${report.routes.dpFlows} DP flows)`
      : `routes: up to ${report.routes.maxFlowsPerLink} DP flows share a link`,
    `journal: ${report.journalRecords} records`,
  ];
  if (report.jobs.length) {
    lines.push("", table(["job", "workers", "expected", "started", "generation", "hosts"], report.jobs.map((j) => [j.id, j.hosts.length, j.expected, j.started ? "yes" : "no", j.generation, j.hosts.join(" ")])));
  }
  const scheduler = report.scheduler;
  if (scheduler) {
    lines.push("", `scheduler: ${scheduler.pinned.length} pinned jobs, ${scheduler.unavailable.length} unavailable hosts, ${scheduler.holds.length} holds`);
    if (scheduler.pinned.length) lines.push(table(["pinned job", "rings", "hosts"], scheduler.pinned.map((j) => [j.id, j.rings, j.hosts.join(" ")])));
    if (scheduler.unavailable.length) lines.push(table(["unavailable", "why"], scheduler.unavailable.map((u) => [u.host, u.why])));
    if (scheduler.holds.length) lines.push(table(["hold", "job", "node"], scheduler.holds.map((h) => [h.name, h.job, h.node])));
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

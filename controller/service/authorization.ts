import type { Principal } from "../../sdk/contract/protocol/auth.ts";
import type { Request } from "../../sdk/contract/protocol/codec.ts";
import type { CommandReply } from "../../sdk/contract/protocol/commands.ts";
import { assertNever } from "./migration.ts";

/**
 * Who may send what (docs/security.md): a job's credential speaks only for that job's
 * workers, a daemon's only for its own host, and only an operator reads `status`; an operator
 * may also end any job, so a job whose key was revoked can still be ended. A controller
 * without a keyring cannot tell senders apart and lets `anyone` do everything.
 */

/** The sender of a message: a keyring principal, or `anyone` on a controller without a keyring. */
export type Caller = Principal | { readonly role: "anyone" };
export const ANYONE: Caller = { role: "anyone" };

/** The rules, by name; a refusal names the one it broke. */
export type Rule = "job-credential-own-job" | "daemon-credential-own-host" | "status-needs-operator";

export interface Refusal {
  readonly rule: Rule;
  readonly message: string;
}

const describe = (caller: Caller): string => {
  switch (caller.role) {
    case "job":
      return `job ${JSON.stringify(caller.job)}'s credential`;
    case "daemon":
      return `host ${caller.host}'s daemon credential`;
    case "operator":
      return "an operator credential";
    case "anyone":
      return "no credential";
    default:
      return assertNever(caller);
  }
};

function forJob(caller: Caller, job: string, type: string): Refusal | null {
  if (caller.role === "anyone" || (caller.role === "job" && caller.job === job)) return null;
  return {
    rule: "job-credential-own-job",
    message: `${type} for job ${JSON.stringify(job)} needs that job's credential, and this is ${describe(caller)}; a job credential may register, report and finish only its own job, and an operator's may finish any`,
  };
}

function forHost(caller: Caller, host: number, type: string): Refusal | null {
  if (caller.role === "anyone" || (caller.role === "daemon" && caller.host === host)) return null;
  return {
    rule: "daemon-credential-own-host",
    message: `${type} for host ${host} needs that host's daemon credential, and this is ${describe(caller)}; a daemon credential speaks only for its own host`,
  };
}

/** Null when `caller` may send `message`; otherwise the rule it breaks. */
export function authorize(caller: Caller, message: Request | CommandReply): Refusal | null {
  switch (message.type) {
    case "worker.register":
    case "worker.report":
      return forJob(caller, message.worker.job, message.type);
    case "job.finish":
      return caller.role === "operator" ? null : forJob(caller, message.job, message.type);
    case "daemon.register":
    case "daemon.heartbeat":
    case "daemon.transfer-result":
    case "daemon.replacement-exited":
    case "daemon.vouch":
    case "daemon.prepared":
    case "daemon.done":
    case "daemon.refused":
      return forHost(caller, message.host, message.type);
    case "status":
    case "events":
      if (caller.role === "anyone" || caller.role === "operator") return null;
      return {
        rule: "status-needs-operator",
        message: `${message.type} needs an operator credential, and this is ${describe(caller)}; create one with \`monkeytree keys --operator NAME\``,
      };
    default:
      return assertNever(message);
  }
}

/**
 * `monkeytree`: what a launcher or a training integration imports. The controller protocol's
 * schemas are `monkeytree/protocol`, the checkpoint layout `monkeytree/checkpoint`, the
 * transfer engine `monkeytree/native` and the planner `monkeytree/planner`.
 */
export { ClientClosedError, ControllerClient, ControllerError, ControllerTimeoutError, UnexpectedReplyError, type ClientOptions } from "./client/client.ts";
export { WorkerClient, type AgentOptions } from "./client/agent.ts";
export { InvalidInputError, type InputIssue } from "./contract/errors.ts";
export { CheckpointError, type CheckpointErrorCode, type CheckpointItemInput, type CheckpointView } from "./contract/checkpoint/index.ts";
export { TransferError, type TransferErrorCode, type TransferResult, type Transport } from "../native/index.ts";
export {
  openStagedCheckpoint,
  ReplacementEnvironmentError,
  replacementFromEnv,
  sendCheckpoint,
  type MigrateOut,
  type SendCheckpointOptions,
  type SentCheckpoint,
  type StagedCheckpoint,
} from "./client/migrate.ts";
export type { ReplacementEnv } from "./contract/protocol/replacement.ts";
export type { Assignment, Directive, Parallelism, WorkerIdentity } from "./contract/protocol/worker.ts";
export type { StatusReport } from "./contract/protocol/status.ts";
export type { ErrorCode } from "./contract/protocol/errors.ts";

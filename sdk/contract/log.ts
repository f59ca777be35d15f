/** A small role-prefixed logger (`[controller] …`, `[daemon 12] …`), shared by the controller and the SDK. Messages are built only when logged. */
export type Level = "debug" | "info" | "warn" | "error";
const RANK: Record<Level, number> = { debug: 0, info: 1, warn: 2, error: 3 };

export interface Logger {
  debug(message: () => string): void;
  info(message: () => string): void;
  warn(message: () => string): void;
  error(message: () => string): void;
}

/** Where log lines go: stderr by default, an array in tests. */
export type Sink = (line: string, level: Level) => void;

export const stderrSink: Sink = (line) => process.stderr.write(`${line}\n`);

/** `$MONKEYTREE_LOG` (debug, info, warn or error) sets the default level; info otherwise. */
function levelFromEnvironment(): Level {
  const value = process.env.MONKEYTREE_LOG;
  return value !== undefined && value in RANK ? (value as Level) : "info";
}

export function createLogger(role: string, sink: Sink = stderrSink, threshold: Level = levelFromEnvironment()): Logger {
  const at = (level: Level) => (message: () => string) => {
    if (RANK[level] >= RANK[threshold]) sink(`[${role}] ${level === "info" ? "" : `${level}: `}${message()}`, level);
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

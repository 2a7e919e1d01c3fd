// Types of standard-agents-client (src/index.js): the API's resources as docs/http-api.md describes them, and the
// events of its streams by name, from the server's table (app/event_types.py; tests/test_client_js.py checks that
// every event type there is here).

export declare const VERSION: string;
export declare const THREAD_EVENTS: readonly (keyof ThreadEventData)[];
export declare const LIFECYCLE_EVENTS: readonly (keyof LifecycleEventData)[];

export type Uuid = string;
/** An ISO-8601 timestamp in UTC. */
export type Timestamp = string;
export type Side = "a" | "b";
export type ThreadStatus = "idle" | "queued" | "running" | "waiting" | "stopped" | "terminated";

/** The server's error envelope, thrown for every failed call. */
export declare class AgentsError extends Error {
  constructor(init: {
    status: number;
    code: string;
    message: string;
    details?: Record<string, unknown> | null;
    headers?: Headers | null;
  });
  readonly name: "AgentsError";
  /** The HTTP status. */
  status: number;
  /** Stable and machine-readable (`thread_not_found`, `invalid_request`, ...); `http_<status>` for an answer that
   * was not the envelope. */
  code: string;
  /** More to say when there is: `problems` for a 422, `missing` for `missing_variables`, ... */
  details: Record<string, unknown> | null;
  headers: Headers | null;
  static from(response: Response): Promise<AgentsError>;
}

// --- resources ---------------------------------------------------------------------------------------------------

export interface Variable {
  name: string;
  type: string;
  required: boolean;
  scoped: boolean;
  description: string;
}

export interface Agent {
  name: string;
  type: "ai_human" | "dual_ai" | string;
  title: string | null;
  description: string | null;
  icon: string | null;
  expose_as_tool: boolean;
  variables: Variable[];
}

export interface AgentSide {
  label: string | null;
  prompt: string;
  stop_on_response: boolean;
  stop_tool: string | null;
  max_steps: number | null;
  /** the session tools the side binds: `stop`, `fail`, `status` → the tool's name */
  session_tools: Partial<Record<"stop" | "fail" | "status", string>>;
}

export interface ToolLink {
  name: string;
  kind: "tool" | "subprompt" | "subagent" | "handoff";
  description: string | null;
  optional: string | null;
  blocking: boolean | null;
  resumable: boolean | null;
  immediate: boolean | null;
}

export interface PromptDetail {
  name: string;
  model: string;
  description: string | null;
  include_chat: boolean;
  includes: string[];
  hooks: string[];
  tools: ToolLink[];
}

export interface AgentDetail extends Agent {
  side_a: AgentSide;
  side_b: AgentSide | null;
  prompts: string[];
  max_session_turns: number | null;
  hooks: string[];
  /** the sides' prompts, then the subprompts they reach: the agent's shape */
  prompt_details: PromptDetail[];
}

export interface Session {
  number: number;
  turns: number;
  status: "running" | "success" | "failure" | null;
  reason: string | null;
  result: { content?: string | null; attachments?: unknown[] } | null;
  status_text: string | null;
}

export interface Thread {
  id: Uuid;
  agent: string;
  origin_agent: string | null;
  type: "ai_human" | "dual_ai" | string;
  parent_id: Uuid | null;
  user_id: string;
  name: string | null;
  tags: string[];
  status: ThreadStatus;
  side: Side | null;
  session: Session;
  /** Text values, secret ones null; null in listings. */
  env: Record<string, string | null> | null;
  env_types: Record<string, "text" | "secret">;
  created_at: Timestamp;
  updated_at: Timestamp;
  last_message_at: Timestamp | null;
  terminated_at: Timestamp | null;
  children_count: number;
}

export interface ThreadList {
  threads: Thread[];
  next_cursor: string | null;
}

export interface AttachmentIn {
  name: string;
  mime_type: string;
  /** base64, a `data:` URL prefix allowed */
  data: string;
}

export interface MessageIn {
  content?: string | null;
  role?: "user" | "assistant" | "system";
  attachments?: AttachmentIn[];
  silent?: boolean;
  metadata?: Record<string, unknown>;
}

export interface ThreadIn {
  agent: string;
  env?: Record<string, string>;
  secrets?: string[];
  tags?: string[];
  name?: string | null;
  messages?: MessageIn[];
}

export interface ThreadPatch {
  name?: string | null;
  tags?: string[] | null;
  env?: Record<string, string>;
  secrets?: string[];
  env_delete?: string[];
}

export interface ThreadFilters {
  agent?: string;
  tag?: string;
  /** a thread id, or `none` for top-level threads */
  parent_id?: Uuid | "none";
  status?: ThreadStatus;
  limit?: number;
  cursor?: string;
}

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface Message {
  id: Uuid;
  role: "user" | "assistant" | "system" | "tool" | string;
  side: Side | null;
  content: string | null;
  name: string | null;
  tool_calls: ToolCall[] | null;
  tool_call_id: string | null;
  tool_status: "success" | "error" | string | null;
  status: "pending" | "completed" | "failed" | string;
  silent: boolean;
  depth: number;
  parent_id: Uuid | null;
  attachments: FileRecord[] | Record<string, unknown>[];
  reasoning_content: string | null;
  metadata: Record<string, unknown>;
  subagent_id: Uuid | null;
  subagent_name: string | null;
  subagent_title: string | null;
  subagent_description: string | null;
  subagent_status: string | null;
  subagent_resumable: boolean | null;
  subagent_blocking: boolean | null;
  subagent_thread_name: string | null;
  subagent_spawn_group_id: Uuid | null;
  model: string | null;
  usage: Record<string, unknown> | null;
  created_at: Timestamp;
}

export interface MessageList {
  messages: Message[];
  next_cursor: string | null;
}

export interface MessageFilters {
  limit?: number;
  cursor?: string;
  order?: "asc" | "desc";
  include_silent?: boolean;
  depth?: number;
  since_id?: Uuid;
}

export interface Queued {
  message_id: Uuid;
  status: "queued";
}

/** `POST /messages?wait=`: the input's turn, ended (`done`) or as far as it got. */
export interface Turn {
  message_id: Uuid;
  done: boolean;
  status: ThreadStatus;
  outcome: "completed" | "failed" | "stopped" | "terminated" | null;
  error: { code: string; message: string } | null;
  messages: Message[];
}

/** A file of a multipart message: a `Blob` or `File`, or its bytes with a name. */
export type FileUpload = Blob | { name: string; data: BlobPart; type?: string };

export interface MessagePost extends MessageIn {
  /** Files sent as multipart parts (stored under `/attachments/`). */
  files?: FileUpload[];
}

export interface Log {
  id: Uuid;
  kind: "llm" | "tool" | "hook" | string;
  message_id: Uuid | null;
  model: string | null;
  provider: string | null;
  tool: string | null;
  attempt: number;
  status: string;
  error: string | null;
  input_tokens: number | null;
  output_tokens: number | null;
  cached_tokens: number | null;
  reasoning_tokens: number | null;
  cost: number | null;
  latency_ms: number | null;
  ttft_ms: number | null;
  finish_reason: string | null;
  response: Record<string, unknown> | null;
  retry_of: Uuid | null;
  fallback_of: Uuid | null;
  request: Record<string, unknown> | null;
  created_at: Timestamp;
}

/** One log with the whole request its model call was sent (`LOG_REQUESTS=full`), else `request_full: null`. */
export interface LogDetail extends Log {
  request_full: Record<string, unknown> | null;
}

export interface LogList {
  logs: Log[];
  next_cursor: string | null;
}

export interface FileRecord {
  path: string;
  name: string;
  type: "file" | "directory";
  size: number;
  mime_type: string | null;
  /** the content's SHA-256 (files only); the download's `ETag` is it in quotes */
  etag: string | null;
  width?: number | null;
  height?: number | null;
}

export interface FileList {
  path: string;
  entries: FileRecord[];
}

export interface FileUsage {
  files: number;
  directories: number;
  bytes: number;
}

export interface GrepResult {
  pattern: string;
  matches: { path: string; line: number; text: string }[];
}

export interface Effect {
  id: Uuid;
  name: string;
  args: Record<string, unknown>;
  run_at: Timestamp;
  status: "scheduled" | "queued" | "running" | "done" | "failed" | "cancelled";
  attempts: number;
  last_error: string | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

export interface SubagentEntry {
  reference: Uuid;
  name: string;
  title: string | null;
  description: string | null;
  resumable: boolean;
  blocking: boolean;
  thread_name: string | null;
  spawn_group_id: Uuid | null;
  created_at: Timestamp;
  status: string;
  parent_communication: "implicit" | "explicit";
}

export interface VariableRequest {
  request_id: Uuid;
  parent_thread_id: Uuid;
  agent: string;
  required: string[];
  missing: string[];
  status: "pending" | "success";
  child_thread_id: Uuid | null;
}

export interface VariablesDone {
  request_id: Uuid;
  child_thread_id: Uuid;
  status: "success";
}

export interface EnvVariable {
  name: string;
  type: "text" | "secret";
  value: string | null;
}

export interface EnvList {
  env: Record<string, string | null>;
  env_types: Record<string, "text" | "secret">;
}

export interface StreamToken {
  token: string;
  expires_in: number;
  /** the stream's path with the token, for `new EventSource(baseUrl + url)` */
  url: string;
}

// --- events ------------------------------------------------------------------------------------------------------

export interface Chunk {
  message_id: Uuid;
  depth: number;
  offset: number;
  chunk: string;
  attempt: number;
}

export interface Lifecycle {
  thread_id: Uuid;
  agent: string;
  status: ThreadStatus;
  name: string | null;
}

/** Every event of a thread's stream and its `data`, by event name. */
export interface ThreadEventData {
  message_data: { message_id: Uuid; depth: number; data: Message };
  message_deleted: { message_id: Uuid; depth: number };
  message_chunk: Chunk;
  reasoning_chunk: Chunk;
  step_started: { step: number; side: Side };
  step_completed: { step: number; side: Side; stopped: boolean };
  llm_request: { model: string; attempt: number };
  llm_response: { model: string; tokens: Record<string, number>; latency_ms: number; ttft_ms: number | null };
  fallback_triggered: { from: string; to: string; error: string };
  tool_started: { tool: string; tool_call_id: string; depth?: number };
  tool_completed: { tool: string; tool_call_id: string; status: "success" | "error"; depth?: number };
  turn_ended: { side: Side; reason: "stop_on_response" | "stop_tool" | "max_steps" | "empty_response" | null };
  session_ended: {
    status: "success" | "failure";
    reason: string;
    result?: { content?: string | null; attachments?: unknown[] };
  };
  thread_status: { status: ThreadStatus; status_text?: string | null };
  stopped_by_user: Record<string, never>;
  thread_terminated: Record<string, never>;
  agent_handoff: { from_agent: string; to_agent: string };
  subagent_created: SubagentEntry;
  subagent_status: SubagentEntry;
  event: { event_type: string; data: unknown };
  error: { code: string; message: string };
  events_missed: { oldest_seq: number };
}

/** Every event of the lifecycle stream (`GET /events`) and its `data`. */
export interface LifecycleEventData {
  thread_created: Lifecycle;
  thread_updated: Lifecycle;
  thread_deleted: Lifecycle;
  events_missed: { oldest_seq: number };
}

/** One event as the iterators yield it: `seq` is the stored event's id, `null` for the live-only ones
 * (`message_chunk`, `reasoning_chunk`) and `events_missed`. */
export type EventOf<Data> = {
  [Name in keyof Data]: { event: Name; seq: number | null; data: Data[Name] };
}[keyof Data];
export type ThreadEvent = EventOf<ThreadEventData>;
export type LifecycleEvent = EventOf<LifecycleEventData>;

/** An SSE frame as `readEvents` reads it. */
export interface Frame {
  event: string;
  id: string | null;
  data: string;
}

export declare function readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame, void, undefined>;

// --- the client --------------------------------------------------------------------------------------------------

export interface ClientOptions {
  /** The server's address (`http://localhost:8000`); "" (the default) for the page's own origin. */
  baseUrl?: string;
  /** An API key, sent as `Authorization: Bearer`; none in open mode. */
  apiKey?: string | null;
  fetch?: typeof fetch;
  EventSource?: typeof EventSource;
  /** More headers for every request. */
  headers?: Record<string, string>;
  /** ms before a stream reconnects, doubled while it keeps failing (default 1000). */
  reconnectDelay?: number;
  /** the longest wait between reconnects in ms (default 15000). */
  maxReconnectDelay?: number;
  /** ms a `fetch` stream may stay silent before it is taken for dropped and resumed (default 45000; the server
   * sends a keep-alive every 15 s). */
  idleTimeout?: number;
}

export interface CallOptions {
  signal?: AbortSignal;
  headers?: Record<string, string>;
}

export interface RequestOptions extends CallOptions {
  /** sent as JSON */
  body?: unknown;
  /** sent as multipart */
  form?: FormData;
  /** sent as it is */
  data?: BodyInit;
  /** answer the `Response` itself rather than its JSON */
  raw?: boolean;
}

export interface StreamOptions {
  /** resume after this `seq` (the stream starts at the thread's first stored event without it) */
  since?: number;
  /** aborting it ends the iteration (as `break` does) and closes the connection */
  signal?: AbortSignal;
  /** called each time a connection opens */
  onOpen?: () => void;
  /** called when a connection dropped or was refused and the client will try again */
  onRetry?: (error: unknown) => void;
}

export interface ThreadStreamOptions extends StreamOptions {
  include_silent?: boolean;
  depth?: number;
  reasoning?: boolean;
}

export declare class AgentsClient {
  constructor(options?: ClientOptions);
  readonly baseUrl: string;
  readonly apiKey: string | null;

  health(options?: CallOptions): Promise<{ status: "ok"; version: string }>;
  ready(options?: CallOptions): Promise<{ status: "ready" }>;
  /** Any call: its JSON answer (`null` for a 204), or with `raw` the `Response`; failures throw `AgentsError`. */
  request<T = unknown>(method: string, path: string, options?: RequestOptions & { raw?: false }): Promise<T>;
  request(method: string, path: string, options: RequestOptions & { raw: true }): Promise<Response>;

  agents: {
    list(options?: CallOptions): Promise<Agent[]>;
    get(name: string, options?: CallOptions): Promise<AgentDetail>;
  };

  threads: {
    create(body: ThreadIn, options?: CallOptions): Promise<Thread>;
    list(filters?: ThreadFilters, options?: CallOptions): Promise<ThreadList>;
    get(threadId: Uuid, options?: CallOptions): Promise<Thread>;
    update(threadId: Uuid, patch: ThreadPatch, options?: CallOptions): Promise<Thread>;
    delete(threadId: Uuid, options?: CallOptions): Promise<{ deleted: Uuid[] }>;
    stop(threadId: Uuid, options?: CallOptions): Promise<Thread>;
    continue(threadId: Uuid, body?: { side?: Side }, options?: CallOptions): Promise<Thread>;
    terminate(threadId: Uuid, options?: CallOptions): Promise<Thread>;
    subagents(threadId: Uuid, options?: CallOptions): Promise<{ subagents: SubagentEntry[] }>;
    logs(
      threadId: Uuid,
      filters?: { kind?: "llm" | "tool" | "hook"; limit?: number; cursor?: string },
      options?: CallOptions,
    ): Promise<LogList>;
    log(threadId: Uuid, logId: Uuid, options?: CallOptions): Promise<LogDetail>;
  };

  messages: {
    /** Queue a message (a string is its `content`); `files` sends it as multipart. */
    post(threadId: Uuid, message: string | MessagePost, options?: CallOptions & { wait?: undefined }): Promise<Queued>;
    /** With `wait` (seconds, at most 300): the turn the input starts or joins. */
    post(threadId: Uuid, message: string | MessagePost, options: CallOptions & { wait: number }): Promise<Turn>;
    list(threadId: Uuid, filters?: MessageFilters, options?: CallOptions): Promise<MessageList>;
    get(threadId: Uuid, messageId: Uuid, options?: CallOptions): Promise<Message>;
    edit(threadId: Uuid, messageId: Uuid, content: string, options?: CallOptions): Promise<Message>;
    delete(threadId: Uuid, messageId: Uuid, options?: CallOptions): Promise<null>;
  };

  events: {
    /** A thread's events read with `fetch`; resumes by itself with `Last-Event-ID`, never yields a stored event
     * twice nor skips one. */
    stream(threadId: Uuid, options?: ThreadStreamOptions): AsyncGenerator<ThreadEvent, void, undefined>;
    lifecycle(options?: StreamOptions): AsyncGenerator<LifecycleEvent, void, undefined>;
    /** The same over a browser's `EventSource`, with a stream token when the client has a key. */
    source(threadId: Uuid, options?: ThreadStreamOptions): AsyncIterableIterator<ThreadEvent>;
    lifecycleSource(options?: StreamOptions): AsyncIterableIterator<LifecycleEvent>;
  };

  streamTokens: {
    create(body?: { thread_id?: Uuid }, options?: CallOptions): Promise<StreamToken>;
  };

  files: {
    list(threadId: Uuid, path?: string, options?: CallOptions): Promise<FileList>;
    stats(threadId: Uuid, options?: CallOptions): Promise<FileUsage>;
    grep(threadId: Uuid, pattern: string, options?: CallOptions): Promise<GrepResult>;
    find(threadId: Uuid, glob: string, options?: CallOptions): Promise<FileList>;
    upload(
      threadId: Uuid,
      path: string,
      data: BodyInit,
      options?: CallOptions & { contentType?: string },
    ): Promise<FileRecord>;
    /** The file's `Response` (304 with a matching `ifNoneMatch`). */
    download(
      threadId: Uuid,
      path: string,
      options?: CallOptions & { thumbnail?: boolean; ifNoneMatch?: string },
    ): Promise<Response>;
    delete(threadId: Uuid, path: string, options?: CallOptions): Promise<{ deleted: string }>;
  };

  variables: {
    get(threadId: Uuid, requestId: Uuid, options?: CallOptions): Promise<VariableRequest>;
    provide(
      threadId: Uuid,
      requestId: Uuid,
      env: Record<string, string>,
      options?: CallOptions,
    ): Promise<VariablesDone>;
  };

  env: {
    list(scope: "user" | "instance", options?: CallOptions): Promise<EnvList>;
    get(scope: "user" | "instance", name: string, options?: CallOptions): Promise<EnvVariable>;
    set(
      scope: "user" | "instance",
      name: string,
      value: string,
      options?: CallOptions & { type?: "text" | "secret" },
    ): Promise<EnvVariable>;
    delete(scope: "user" | "instance", name: string, options?: CallOptions): Promise<EnvVariable>;
  };

  effects: {
    list(threadId: Uuid, options?: CallOptions): Promise<{ effects: Effect[] }>;
    cancel(threadId: Uuid, effectId: Uuid, options?: CallOptions): Promise<Effect>;
  };

  endpoints: {
    /** A custom thread endpoint: its JSON answer, or the `Response` when it is not JSON. */
    call<T = unknown>(
      threadId: Uuid,
      path: string,
      options?: CallOptions & { method?: string; body?: unknown; params?: Record<string, string | number | boolean> },
    ): Promise<T | Response>;
  };
}

package costmodel

// Attack tests: text put where the estimator does not read it must still be
// counted. A tenant who wants to pay less moves bulk text out of a plain
// message into an item, a block or a field costgate does not know; the
// upstream bills it all the same. Each case puts hiddenKB of prose in one
// such place and checks that the estimate is at least what the same prose
// counts in a plain user message, less a few tokens of message overhead.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"testing"
	"unicode/utf8"
)

const (
	hiddenKB     = 8
	hiddenMargin = 16 // tokens: the plain message's role and overhead
)

// hiddenText returns kb KiB of prose (cut at a rune boundary).
func hiddenText(tb testing.TB, kb int) string {
	tb.Helper()
	prose, err := os.ReadFile("testdata/prose_contract.md")
	if err != nil {
		tb.Fatal(err)
	}
	for len(prose) < kb<<10 {
		prose = append(prose, prose...)
	}
	s := prose[:kb<<10]
	for !utf8.Valid(s) {
		s = s[:len(s)-1]
	}
	return string(s)
}

// jsonText returns s as a JSON string.
func jsonText(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pngBase64 returns a w×h PNG, base64-encoded.
func pngBase64(tb testing.TB, w, h int) string {
	tb.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		tb.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func inputTokensOf(tb testing.TB, e *Estimator, kind Kind, body string) int64 {
	tb.Helper()
	est, err := e.Estimate(kind, []byte(body))
	if err != nil {
		tb.Fatalf("%s: %v", kind, err)
	}
	return est.Usage.InputTokens
}

// hiddenCase is a request that hides something, and the plain request
// that holds the same thing where costgate reads it.
type hiddenCase struct {
	name          string
	hidden, plain string
}

func checkHidden(t *testing.T, e *Estimator, kind Kind, cases []hiddenCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := inputTokensOf(t, e, kind, c.plain)
			got := inputTokensOf(t, e, kind, c.hidden)
			t.Logf("hidden: %d input tokens; in plain sight: %d", got, want)
			if got < want-hiddenMargin {
				t.Errorf("hidden: %d input tokens; the same in plain sight: %d", got, want)
			}
		})
	}
}

// TestAttackResponsesItemKinds hides text in /v1/responses input items and
// parts of kinds the estimator did not read (tool calls and their outputs,
// reasoning summaries, unknown kinds).
func TestAttackResponsesItemKinds(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	const model = "gpt-4.1"
	req := func(items string) string { return `{"model":"` + model + `","input":[` + items + `]}` }
	plain := req(`{"role":"user","content":` + text + `}`)
	img := "data:image/png;base64," + pngBase64(t, 2000, 1000)
	plainImage := req(`{"role":"user","content":[{"type":"input_image","image_url":"` + img + `"}]}`)
	items := []struct{ name, item string }{
		{"local_shell_call_output", `{"type":"local_shell_call_output","id":"ls_1","output":` + text + `}`},
		{"local_shell_call command", `{"type":"local_shell_call","id":"ls_1","call_id":"c","status":"completed","action":{"type":"exec","command":["echo",` + text + `],"env":{}}}`},
		{"shell_call_output stdout", `{"type":"shell_call_output","call_id":"c","output":[{"stdout":` + text + `,"stderr":"","outcome":{"type":"exit","exit_code":0}}]}`},
		{"shell_call commands", `{"type":"shell_call","call_id":"c","status":"completed","action":{"commands":[` + text + `]}}`},
		{"mcp_call arguments", `{"type":"mcp_call","id":"mcp_1","server_label":"s","name":"f","arguments":` + text + `,"output":"ok"}`},
		{"mcp_call output", `{"type":"mcp_call","id":"mcp_1","server_label":"s","name":"f","arguments":"{}","output":` + text + `}`},
		{"mcp_call error", `{"type":"mcp_call","id":"mcp_1","server_label":"s","name":"f","arguments":"{}","error":` + text + `}`},
		{"mcp_list_tools description", `{"type":"mcp_list_tools","id":"ml_1","server_label":"s","tools":[{"name":"t","description":` + text + `,"input_schema":{"type":"object"}}]}`},
		{"mcp_approval_request arguments", `{"type":"mcp_approval_request","id":"ar_1","server_label":"s","name":"f","arguments":` + text + `}`},
		{"apply_patch_call diff", `{"type":"apply_patch_call","call_id":"c","status":"completed","operation":{"type":"create_file","path":"a.txt","diff":` + text + `}}`},
		{"apply_patch_call_output", `{"type":"apply_patch_call_output","call_id":"c","status":"completed","output":` + text + `}`},
		{"computer_call action text", `{"type":"computer_call","id":"cu_1","call_id":"c","status":"completed","action":{"type":"type","text":` + text + `},"pending_safety_checks":[]}`},
		{"computer_call_output safety message", `{"type":"computer_call_output","call_id":"c","output":{"type":"computer_screenshot","image_url":"https://x/s.png"},"acknowledged_safety_checks":[{"id":"sc","code":"c","message":` + text + `}]}`},
		{"code_interpreter_call code", `{"type":"code_interpreter_call","id":"ci_1","status":"completed","container_id":"cntr","code":` + text + `,"outputs":[]}`},
		{"code_interpreter_call logs", `{"type":"code_interpreter_call","id":"ci_1","status":"completed","container_id":"cntr","code":"print()","outputs":[{"type":"logs","logs":` + text + `}]}`},
		{"file_search_call results", `{"type":"file_search_call","id":"fs_1","status":"completed","queries":["q"],"results":[{"file_id":"f","filename":"a","score":1,"text":` + text + `}]}`},
		{"web_search_call query", `{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":` + text + `}}`},
		{"reasoning summary", `{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":` + text + `}]}`},
		{"reasoning content", `{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":` + text + `}]}`},
		{"unknown item kind", `{"type":"future_tool_call_output","call_id":"c","output":` + text + `}`},
		{"unknown item kind, nested", `{"type":"future_tool_call","call_id":"c","payload":{"a":[{"b":` + text + `}]}}`},
		{"message refusal part", `{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":` + text + `}]}`},
		{"message unknown part", `{"type":"message","role":"user","content":[{"type":"input_future","data":` + text + `}]}`},
	}
	cases := make([]hiddenCase, 0, len(items)+2)
	for _, it := range items {
		cases = append(cases, hiddenCase{it.name, req(it.item), plain})
	}
	cases = append(cases,
		hiddenCase{"computer_call_output screenshot", req(`{"type":"computer_call_output","call_id":"c","output":{"type":"computer_screenshot","image_url":"` + img + `"}}`), plainImage},
		hiddenCase{"image_generation_call result", req(`{"type":"image_generation_call","id":"ig_1","status":"completed","result":"` + img[len("data:image/png;base64,"):] + `"}`), plainImage},
	)
	checkHidden(t, e, Responses, cases)
}

// TestAttackAnthropicBlockKinds hides text in /v1/messages content blocks of
// kinds the estimator did not read (server tools' results, MCP blocks,
// unknown kinds), at the top of a message and inside a tool result.
func TestAttackAnthropicBlockKinds(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	req := func(role, blocks string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"` + role + `","content":[` + blocks + `]}]}`
	}
	plain := `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":` + text + `}]}`
	blocks := []struct{ name, role, block string }{
		{"code_execution_tool_result", "user", `{"type":"code_execution_tool_result","tool_use_id":"srvtoolu_1","content":{"type":"code_execution_result","stdout":` + text + `,"stderr":"","return_code":0,"content":[]}}`},
		{"bash_code_execution_tool_result", "user", `{"type":"bash_code_execution_tool_result","tool_use_id":"srvtoolu_1","content":{"type":"bash_code_execution_result","stdout":` + text + `,"stderr":"","return_code":0,"content":[]}}`},
		{"text_editor_code_execution_tool_result", "user", `{"type":"text_editor_code_execution_tool_result","tool_use_id":"srvtoolu_1","content":{"type":"text_editor_code_execution_view_result","file_type":"text","content":` + text + `,"num_lines":1,"start_line":1,"total_lines":1}}`},
		{"web_fetch_tool_result", "user", `{"type":"web_fetch_tool_result","tool_use_id":"srvtoolu_1","content":{"type":"web_fetch_result","url":"https://x","content":{"type":"document","source":{"type":"text","media_type":"text/plain","data":` + text + `}}}}`},
		{"web_search_tool_result", "user", `{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://x","title":"t","encrypted_content":` + text + `}]}`},
		{"mcp_tool_use input", "assistant", `{"type":"mcp_tool_use","id":"mcptoolu_1","name":"f","server_name":"s","input":{"q":` + text + `}}`},
		{"mcp_tool_result", "user", `{"type":"mcp_tool_result","tool_use_id":"mcptoolu_1","is_error":false,"content":[{"type":"text","text":` + text + `}]}`},
		{"mcp_tool_result string", "user", `{"type":"mcp_tool_result","tool_use_id":"mcptoolu_1","content":` + text + `}`},
		{"container_upload file_id", "user", `{"type":"container_upload","file_id":` + text + `}`},
		{"unknown block kind", "user", `{"type":"future_block","payload":{"a":[` + text + `]}}`},
		{"unknown block in a tool_result", "user", `{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"future_block","data":` + text + `}]}`},
	}
	cases := make([]hiddenCase, 0, len(blocks)+1)
	for _, b := range blocks {
		cases = append(cases, hiddenCase{b.name, req(b.role, b.block), plain})
	}
	cases = append(cases, hiddenCase{"unknown block in the system prompt",
		`{"model":"claude-sonnet-4-5","max_tokens":16,"system":[{"type":"future_block","data":` + text + `}],"messages":[]}`, plain})
	checkHidden(t, e, AnthropicMessages, cases)
}

// TestAttackImageRuleByName sends one image under other names of a model
// (a fine-tune of it, a dated snapshot's fine-tune, another spelling, an
// alias): each must count the image by the base model's rule, as it is
// priced, not by the cheapest rule a name the rules do not know falls to.
func TestAttackImageRuleByName(t *testing.T) {
	e := estimatorWith(t, Config{Aliases: map[string]string{"acme-vision": "gpt-4o-mini"}})
	const url = "https://x/y.png" // no size in the request: the rule's upper bound
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}}]}]}`
	}
	responses := func(model string) string {
		return `{"model":"` + model + `","input":[{"role":"user","content":[{"type":"input_image","image_url":"` + url + `"}]}]}`
	}
	names := []struct{ name, model, base string }{
		{"ft of gpt-4o-mini", "ft:gpt-4o-mini:acme:name:id1", "gpt-4o-mini"},
		{"ft of a gpt-4o-mini snapshot", "ft:gpt-4o-mini-2024-07-18:acme::id1", "gpt-4o-mini"},
		{"ft of gpt-4o-mini, upper case", "FT:GPT-4O-MINI:acme::id1", "gpt-4o-mini"},
		{"gpt-4o-mini, surrounding space", " gpt-4o-mini ", "gpt-4o-mini"},
		{"configured alias of gpt-4o-mini", "acme-vision", "gpt-4o-mini"},
		{"ft of gpt-4.1-mini", "ft:gpt-4.1-mini:acme::id1", "gpt-4.1-mini"},
		{"ft of a gpt-4.1-nano snapshot", "ft:gpt-4.1-nano-2025-04-14:acme::id1", "gpt-4.1-nano"},
		{"ft of o4-mini", "ft:o4-mini:acme::id1", "o4-mini"},
		{"ft of an unpriced base", "ft:gpt-5-mini:acme::id1", "gpt-5-mini"},
	}
	for _, api := range []struct {
		kind Kind
		body func(string) string
	}{{ChatCompletions, chat}, {Responses, responses}} {
		cases := make([]hiddenCase, 0, len(names))
		for _, n := range names {
			cases = append(cases, hiddenCase{n.name, api.body(n.model), api.body(n.base)})
		}
		t.Run(api.kind.String(), func(t *testing.T) { checkHidden(t, e, api.kind, cases) })
	}
}

// TestAttackToolPromptByName sends Anthropic tools under other spellings of
// claude-3-opus, whose tool-use system prompt is the longest: each must
// reserve that prompt, as the model is priced.
func TestAttackToolPromptByName(t *testing.T) {
	e := estimatorWith(t, Config{Aliases: map[string]string{"acme-opus": "claude-3-opus"}})
	body := func(model string) string {
		return `{"model":"` + model + `","max_tokens":16,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`
	}
	names := []struct{ name, model string }{
		{"surrounding space", " claude-3-opus-20240229"},
		{"configured alias", "acme-opus"},
	}
	cases := make([]hiddenCase, 0, len(names))
	for _, n := range names {
		cases = append(cases, hiddenCase{n.name, body(n.model), body("claude-3-opus")})
	}
	checkHidden(t, e, AnthropicMessages, cases)
}

// schemaHidings are places in a function's parameters schema where the
// cookbook's walk (properties, with their type, description and enum)
// reads nothing; %s is a JSON string of hidden text.
var schemaHidings = []struct{ name, schema string }{
	{"anyOf description", `{"type":"object","properties":{"x":{"anyOf":[{"type":"string","description":%s},{"type":"null"}]}}}`},
	{"oneOf", `{"type":"object","properties":{"x":{"oneOf":[{"const":%s},{"type":"integer"}]}}}`},
	{"allOf", `{"type":"object","properties":{"x":{"allOf":[{"title":%s}]}}}`},
	{"$defs", `{"type":"object","properties":{"x":{"$ref":"#/$defs/d"}},"$defs":{"d":{"type":"string","description":%s}}}`},
	{"definitions", `{"type":"object","properties":{"x":{"$ref":"#/definitions/d"}},"definitions":{"d":{"type":"string","description":%s}}}`},
	{"examples", `{"type":"object","properties":{"x":{"type":"string","examples":[%s]}}}`},
	{"default", `{"type":"object","properties":{"x":{"type":"string","default":%s}}}`},
	{"const", `{"type":"object","properties":{"x":{"type":"string","const":%s}}}`},
	{"title", `{"type":"object","properties":{"x":{"type":"string","title":%s}}}`},
	{"pattern", `{"type":"object","properties":{"x":{"type":"string","pattern":%s}}}`},
	{"additionalProperties schema", `{"type":"object","properties":{},"additionalProperties":{"type":"string","description":%s}}`},
	{"not", `{"type":"object","properties":{"x":{"not":{"description":%s}}}}`},
	{"if then else", `{"type":"object","properties":{"x":{"if":{"type":"string"},"then":{"description":%s},"else":{"type":"null"}}}}`},
	{"prefixItems", `{"type":"object","properties":{"x":{"type":"array","prefixItems":[{"type":"string","description":%s}]}}}`},
	{"unknown keyword, nested", `{"type":"object","properties":{"x":{"type":"string","x-meta":{"a":[{"b":%s}]}}}}`},
	{"items description", `{"type":"object","properties":{"x":{"type":"array","items":{"type":"string","description":%s}}}}`},
	{"items enum", `{"type":"object","properties":{"x":{"type":"array","items":{"type":"string","enum":[%s]}}}}`},
	{"items of items", `{"type":"object","properties":{"x":{"type":"array","items":{"type":"array","items":{"type":"string","description":%s}}}}}`},
	{"parameters description", `{"type":"object","description":%s,"properties":{}}`},
	{"parameters type", `{"type":%s}`},
	{"required, not a property", `{"type":"object","properties":{"x":{"type":"string"}},"required":["x",%s]}`},
	{"property named twice", `{"type":"object","properties":{"x":{"type":"string","description":%s},"x":{"type":"string"}}}`},
	{"description twice", `{"type":"object","properties":{"x":{"type":"string","description":%s,"description":"x"}}}`},
	{"Properties, another spelling", `{"type":"object","Properties":{"x":{"type":"string","description":%s}}}`},
}

// TestAttackToolSchemas hides text in function tools' parameter schemas,
// in members of a tool or a function the estimator did not read, and in
// tools of kinds it did not read, on both OpenAI APIs: each must count at
// least what the same text counts as the tool's description.
func TestAttackToolSchemas(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	const empty = `{"type":"object","properties":{}}`
	chat := func(tools string) string {
		return `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"tools":[` + tools + `]}`
	}
	chatTool := func(desc, params string) string {
		return `{"type":"function","function":{"name":"f","description":` + desc + `,"parameters":` + params + `}}`
	}
	functions := func(desc, params string) string {
		return `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f","description":` + desc + `,"parameters":` + params + `}]}`
	}
	responses := func(tools string) string {
		return `{"model":"gpt-4.1","input":"hi","tools":[` + tools + `]}`
	}
	responsesTool := func(desc, params string) string {
		return `{"type":"function","name":"f","description":` + desc + `,"parameters":` + params + `}`
	}
	var chatCases, responsesCases []hiddenCase
	for _, h := range schemaHidings {
		schema := fmt.Sprintf(h.schema, text)
		chatCases = append(chatCases,
			hiddenCase{"tools/" + h.name, chat(chatTool(`"d"`, schema)), chat(chatTool(text, empty))},
			hiddenCase{"functions/" + h.name, functions(`"d"`, schema), functions(text, empty)})
		responsesCases = append(responsesCases,
			hiddenCase{h.name, responses(responsesTool(`"d"`, schema)), responses(responsesTool(text, empty))})
	}
	chatPlain := chat(chatTool(text, empty))
	chatCases = append(chatCases,
		hiddenCase{"function member", chat(`{"type":"function","function":{"name":"f","parameters":` + empty + `,"x_doc":` + text + `}}`), chatPlain},
		hiddenCase{"tool member", chat(`{"type":"function","function":{"name":"f","parameters":` + empty + `},"x_doc":` + text + `}`), chatPlain},
		hiddenCase{"custom tool member", chat(`{"type":"custom","custom":{"name":"f"},"x_doc":` + text + `}`), chatPlain},
		hiddenCase{"unknown tool kind", chat(`{"type":"future_tool","future_tool":{"name":"f","doc":` + text + `}}`), chatPlain},
		hiddenCase{"legacy function member", functions(`"d"`, empty+`,"x_doc":`+text), functions(text, empty)},
	)
	responsesPlain := responses(responsesTool(text, empty))
	responsesCases = append(responsesCases,
		hiddenCase{"function tool member", responses(`{"type":"function","name":"f","parameters":` + empty + `,"x_doc":` + text + `}`), responsesPlain},
		hiddenCase{"custom tool member", responses(`{"type":"custom","name":"f","x_doc":` + text + `}`), responsesPlain},
		hiddenCase{"unknown tool kind", responses(`{"type":"future_tool","doc":` + text + `}`), responsesPlain},
	)
	t.Run("chat", func(t *testing.T) { checkHidden(t, e, ChatCompletions, chatCases) })
	t.Run("responses", func(t *testing.T) { checkHidden(t, e, Responses, responsesCases) })
}

// TestAttackAnthropicTools hides text in members of an Anthropic tool
// definition the estimator did not read (input_examples, unknown members)
// and in the schema keywords of TestAttackToolSchemas; and in a structured
// output's format.
func TestAttackAnthropicTools(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	req := func(tool string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}],"tools":[` + tool + `]}`
	}
	plain := req(`{"name":"f","description":` + text + `,"input_schema":{"type":"object"}}`)
	cases := []hiddenCase{
		{"input_examples", req(`{"name":"f","input_schema":{"type":"object","properties":{"q":{"type":"string"}}},"input_examples":[{"q":` + text + `}]}`), plain},
		{"unknown member", req(`{"name":"f","input_schema":{"type":"object"},"x_doc":{"a":[` + text + `]}}`), plain},
		{"server tool member", req(`{"type":"text_editor_20250728","name":"str_replace_based_edit_tool","x_doc":{"a":` + text + `}}`), plain},
	}
	for _, h := range schemaHidings {
		cases = append(cases, hiddenCase{"input_schema " + h.name, req(`{"name":"f","input_schema":` + fmt.Sprintf(h.schema, text) + `}`), plain})
	}
	noTools := `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":` + text + `}]}`
	cases = append(cases,
		hiddenCase{"output_format", `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[],"output_format":{"type":"json_schema","schema":{"type":"object","description":` + text + `}}}`, noTools},
		hiddenCase{"output_config format", `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[],"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"string","description":` + text + `}}}}}}`, noTools},
	)
	checkHidden(t, e, AnthropicMessages, cases)
}

// TestAttackChatPartKinds hides text in chat completions content parts of
// kinds the estimator did not read: all their members count, and the
// estimate is Uncounted.
func TestAttackChatPartKinds(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	req := func(part string) string {
		return `{"model":"gpt-4.1","messages":[{"role":"user","content":[` + part + `]}]}`
	}
	plain := `{"model":"gpt-4.1","messages":[{"role":"user","content":` + text + `}]}`
	cases := []hiddenCase{
		{"unknown part kind", req(`{"type":"future_part","data":` + text + `}`), plain},
		{"unknown part kind, nested", req(`{"type":"future_part","future_part":{"a":[{"b":` + text + `}]}}`), plain},
	}
	checkHidden(t, e, ChatCompletions, cases)
	est, err := e.Estimate(ChatCompletions, []byte(cases[0].hidden))
	if err != nil {
		t.Fatal(err)
	}
	if !est.Uncounted {
		t.Error("a part of a kind costgate does not read: the estimate is not Uncounted")
	}
}

// TestAttackChatToolCallKinds: an assistant message's tool call of a kind
// costgate does not read (neither a function's nor a custom tool's) holds
// the text in its own member.
func TestAttackChatToolCallKinds(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := jsonText(hiddenText(t, hiddenKB))
	req := func(call string) string {
		return `{"model":"gpt-4.1","messages":[{"role":"user","content":"go"},{"role":"assistant","tool_calls":[` + call + `]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`
	}
	plain := `{"model":"gpt-4.1","messages":[{"role":"user","content":` + text + `}]}`
	cases := []hiddenCase{
		{"unknown call kind", req(`{"id":"c","type":"future_call","future_call":{"input":` + text + `}}`), plain},
		{"unknown call kind, nested", req(`{"id":"c","type":"future_call","future_call":{"a":[{"b":` + text + `}]}}`), plain},
	}
	checkHidden(t, e, ChatCompletions, cases)
	est, err := e.Estimate(ChatCompletions, []byte(cases[0].hidden))
	if err != nil {
		t.Fatal(err)
	}
	if !est.Uncounted {
		t.Error("a tool call of a kind costgate does not read: the estimate is not Uncounted")
	}
}

package policies

import (
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// jsonFields returns the JSON names of a struct type's fields.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out[name] = f.Type
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestInputSchemaMatchesInput keeps schema/input.schema.json, the Input
// type and the fast path's field table in step: a field added to one and
// not the others would be rejected by the type checker, or read as
// undefined by the fast path.
func TestInputSchemaMatchesInput(t *testing.T) {
	b, err := os.ReadFile("schema/input.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, s map[string]any, typ reflect.Type)
	walk = func(path string, s map[string]any, typ reflect.Type) {
		switch typ.Kind() {
		case reflect.Struct:
			props, _ := s["properties"].(map[string]any)
			fields := jsonFields(typ)
			if !reflect.DeepEqual(sortedKeys(props), sortedKeys(fields)) {
				t.Errorf("%s: schema has %v, Go has %v", path, sortedKeys(props), sortedKeys(fields))
			}
			req, _ := s["required"].([]any)
			if len(req) != len(fields) {
				t.Errorf("%s: %d required fields in the schema, want all %d", path, len(req), len(fields))
			}
			if s["additionalProperties"] != false {
				t.Errorf("%s: schema allows additional properties", path)
			}
			for name, ft := range fields {
				sub, _ := props[name].(map[string]any)
				p := strings.TrimPrefix(path+"."+name, ".")
				walk(p, sub, ft)
			}
		case reflect.Slice:
			if s["type"] != "array" {
				t.Errorf("%s: schema type %v, want array", path, s["type"])
			}
			items, _ := s["items"].(map[string]any)
			walk(path+"[]", items, typ.Elem())
		case reflect.String:
			if s["type"] != "string" {
				t.Errorf("%s: schema type %v, want string", path, s["type"])
			}
		case reflect.Bool:
			if s["type"] != "boolean" {
				t.Errorf("%s: schema type %v, want boolean", path, s["type"])
			}
		case reflect.Int, reflect.Int64:
			if s["type"] != "integer" {
				t.Errorf("%s: schema type %v, want integer", path, s["type"])
			}
		case reflect.Map:
			add, _ := s["additionalProperties"].(map[string]any)
			if s["type"] != "object" || typ.Key().Kind() != reflect.String || add == nil {
				t.Errorf("%s: schema %v for a map, want an object of additionalProperties", path, s)
			}
			walk(path+"{}", add, typ.Elem())
			return
		default:
			t.Errorf("%s: Go type %v has no schema mapping", path, typ)
		}
		// The fast path reads every scalar leaf of input, limits and spend.
		switch {
		case typ.Kind() == reflect.Struct || typ.Kind() == reflect.Slice:
		case strings.HasSuffix(path, "[]") && inputObjects[strings.TrimSuffix(path, "[]")]:
			// An array's elements: the fast path leaves the array to OPA.
		case strings.Contains(path, "{}"):
			// A map's values: the fast path leaves the map to OPA (inputObjects).
			if !inputObjects[strings.Split(path, "{}")[0]] {
				t.Errorf("fast path: %s is neither read nor left to OPA", path)
			}
		case strings.HasPrefix(path, "limits[]."):
			if limitField(&Limit{}, strings.TrimPrefix(path, "limits[].")).k == kUndef {
				t.Errorf("fast path: limitField does not know %s", path)
			}
		case strings.HasPrefix(path, "spend[]."):
			if spendField(&Spend{}, strings.TrimPrefix(path, "spend[].")).k == kUndef {
				t.Errorf("fast path: spendField does not know %s", path)
			}
		default:
			if inputLeaves[path] == nil {
				t.Errorf("fast path: inputLeaves does not know %s", path)
			}
		}
	}
	walk("", schema, reflect.TypeOf(Input{}))
}

// TestDecisionSchemaMatchesDecoder checks that the decision schema lists the
// fields decodeVerdict accepts.
func TestDecisionSchemaMatchesDecoder(t *testing.T) {
	b, err := os.ReadFile("schema/decision.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]struct {
			Properties map[string]any `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if got := sortedKeys(schema.Properties); !reflect.DeepEqual(got, []string{"friction", "outcome", "reason", "status"}) {
		t.Errorf("decision properties %v", got)
	}
	var fr []string
	for k := range jsonFields(reflect.TypeOf(Friction{})) {
		fr = append(fr, k)
	}
	sort.Strings(fr)
	if got := sortedKeys(schema.Properties["friction"].Properties); !reflect.DeepEqual(got, fr) {
		t.Errorf("friction properties %v, Go has %v", got, fr)
	}
	for _, k := range fr {
		if _, err := decodeFriction(map[string]any{k: json.Number("1")}); err != nil && strings.Contains(err.Error(), "unknown field") {
			t.Errorf("decodeFriction rejects documented field %s", k)
		}
	}
}

package mesh

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

var (
	// ErrNotDirectory is wrapped by Load when its path is not a directory.
	ErrNotDirectory = errors.New("not a directory")
	// ErrNoManifests is wrapped by Load when a directory holds no manifest.
	ErrNoManifests = errors.New("no manifests")
)

// Load reads the catalogue in dir: every *.yaml and *.yml file directly in
// it (not in subdirectories; names starting with "." are skipped), in name
// order, one manifest per file. It decodes strictly — an unknown key is a
// problem naming its file and line — and then runs every check (see Check).
//
// The error is only for a catalogue that cannot be read at all: dir is
// missing (wrapping fs.ErrNotExist), is not a directory (ErrNotDirectory) or
// holds no manifest (ErrNoManifests). Anything wrong inside a manifest is a
// Problem, and loading goes on with the other files, so that one run reports
// everything; the problems are sorted by file, then line. The catalogue holds
// every manifest that could be decoded, whatever its problems: a caller
// refuses it when HasErrors(problems).
func Load(dir string) (*Catalogue, []Problem, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("loading catalogue: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("loading catalogue %s: %w", dir, ErrNotDirectory)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("loading catalogue: %w", err)
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isManifestName(name) || e.IsDir() {
			continue
		}
		files = append(files, filepath.Join(dir, name))
	}
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("loading catalogue %s: %w: write one <module>.yaml per module", dir, ErrNoManifests)
	}
	c, problems := loadFiles(files, true)
	c.Dir = dir
	return c, problems, nil
}

// LoadFiles is Load for a list of manifest files rather than a directory. A
// file that cannot be read is a Problem; the error is only for an empty list
// (ErrNoManifests).
func LoadFiles(files []string) (*Catalogue, []Problem, error) {
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("loading catalogue: %w", ErrNoManifests)
	}
	c, problems := loadFiles(files, false)
	return c, problems, nil
}

// Parse decodes one manifest strictly. name is the file the data came from
// and is set as the manifest's File. The manifest is nil when it cannot be
// decoded; the problems are those of decoding only (syntax, unknown keys,
// wrong types) — Check and Load run the checks.
func Parse(name string, data []byte) (*Manifest, []Problem) {
	r := parse(name, data)
	if r.m != nil {
		r.m.File = name
	}
	return r.m, r.probs
}

func isManifestName(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}

func loadFiles(files []string, withFarm bool) (*Catalogue, []Problem) {
	results := parseAll(files)
	var (
		manifests = make([]*Manifest, 0, len(results))
		pos       = make(map[*Manifest]positions, len(results))
		broken    = map[string]string{}
		problems  []Problem
	)
	for i, r := range results {
		problems = append(problems, r.probs...)
		switch {
		case r.m != nil:
			r.m.File = files[i]
			manifests = append(manifests, r.m)
			pos[r.m] = r.pos
		case r.module != "":
			if _, seen := broken[r.module]; !seen {
				broken[r.module] = files[i]
			}
		}
	}
	if withFarm {
		var added []Problem
		manifests, added = addFarm(manifests, pos, broken)
		problems = append(problems, added...)
	}
	problems = append(problems, check(manifests, pos, broken)...)
	sortProblems(problems)
	return NewCatalogue(manifests), problems
}

// parseAll parses files on every available processor; the results are in
// the order of files.
func parseAll(files []string) []parsed {
	out := make([]parsed, len(files))
	workers := min(runtime.GOMAXPROCS(0), len(files))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(files) {
					return
				}
				out[i] = parseFile(files[i])
			}
		})
	}
	wg.Wait()
	return out
}

// parsed is one manifest file after decoding.
type parsed struct {
	m     *Manifest
	pos   positions
	probs []Problem
	// module is the name a manifest that could not be decoded gives itself,
	// when it can be read, so that references to it are not reported too.
	module string
}

// positions maps a field path ("seats[0].accepts[1]") to its line.
type positions map[string]int

// line returns the line of field, or of the nearest enclosing field that
// has one; 0 when none has.
func (p positions) line(field string) int {
	if p == nil {
		return 0
	}
	for field != "" {
		if l, ok := p[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

func parseFile(path string) parsed {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return parsed{probs: []Problem{{File: path, Message: fmt.Sprintf("cannot read the file: %v", err)}}}
	}
	return parse(path, data)
}

func parse(name string, data []byte) parsed {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return parsed{
			probs:  []Problem{decodeProblem(name, err, nil)},
			module: scanModule(data),
		}
	}
	var docs []*ast.DocumentNode
	for _, d := range f.Docs {
		if d != nil && unwrap(d.Body) != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		return parsed{probs: []Problem{{File: name, Line: 1, Message: "the manifest is empty: write `module: NAME` and the module's declarations"}}}
	}
	var r parsed
	for _, d := range docs[1:] {
		r.probs = append(r.probs, Problem{File: name, Line: tokenLine(d.Body.GetToken()),
			Message: "a second document: a file holds one manifest; move this one to its own <module>.yaml"})
	}
	body := docs[0].Body
	w := walker{file: name, pos: positions{}}
	w.walk(body, "", manifestSchema)
	r.pos, r.module = w.pos, w.module
	r.probs = append(r.probs, w.probs...)

	m := new(Manifest)
	if decodePlain(body, m) {
		r.m = m
		return r
	}
	*m = Manifest{}
	if len(w.probs) > 0 {
		// The unknown keys are reported with every line already; decode the
		// rest so that the manifest's other problems are found too.
		err = yaml.NodeToValue(body, m)
	} else {
		err = yaml.NodeToValue(body, m, yaml.Strict())
	}
	if err != nil {
		r.probs = append(r.probs, decodeProblem(name, err, body))
		return r
	}
	r.m = m
	return r
}

// scanModule finds "module: NAME" at the start of a line of a manifest that
// cannot be parsed.
func scanModule(data []byte) string {
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "module:"); ok {
			v, _, _ = strings.Cut(v, "#")
			v = strings.Trim(strings.TrimSpace(v), `"'`)
			if ValidName(v) {
				return v
			}
			return ""
		}
	}
	return ""
}

// decodeProblem turns an error of the YAML parser or decoder into a Problem
// with the line and, when body is given, the field it is about.
func decodeProblem(file string, err error, body ast.Node) Problem {
	p := Problem{File: file, Message: err.Error()}
	var ye yaml.Error
	if !errors.As(err, &ye) {
		return p
	}
	tok := ye.GetToken()
	p.Line = tokenLine(tok)
	p.Message = ye.GetMessage()
	if body != nil && tok != nil {
		w := walker{want: tok}
		w.walk(body, "", nil)
		p.Field = w.found
	}
	var (
		te *yaml.TypeError
		ue *yaml.UnexpectedNodeTypeError
		oe *yaml.OverflowError
	)
	switch {
	case errors.As(err, &te):
		v := ""
		if tok != nil {
			v = tok.Value
		}
		p.Message = fmt.Sprintf("cannot read %q as %s: write %s", v, kindWords(te.DstType), kindWords(te.DstType))
	case errors.As(err, &oe):
		p.Message = fmt.Sprintf("%s is too large: write a smaller number", oe.SrcNum)
	case errors.As(err, &ue):
		switch ue.Expected {
		case ast.SequenceType:
			p.Message = fmt.Sprintf("a %s where a list belongs: write a list, such as [a, b], or one `- item` a line", ue.Actual.YAMLName())
		case ast.MappingType:
			if p.Field == "" {
				p.Message = fmt.Sprintf("a manifest is a mapping, not a %s: write `module: NAME` and the module's declarations", ue.Actual.YAMLName())
			} else {
				p.Message = fmt.Sprintf("a %s where a mapping belongs: write `key: value` lines", ue.Actual.YAMLName())
			}
		}
	}
	return p
}

func kindWords(t reflect.Type) string {
	if t == nil {
		return "the right kind of value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list, such as [a, b]"
	case reflect.Struct, reflect.Pointer, reflect.Map:
		return "a mapping of `key: value` lines"
	case reflect.Bool:
		return "true or false"
	}
	return "a " + t.Kind().String()
}

func tokenLine(t *token.Token) int {
	if t == nil || t.Position == nil {
		return 0
	}
	return t.Position.Line
}

// schema is the shape of a manifest, derived once from Manifest's yaml tags,
// so that the keys a walk accepts are exactly those decoding accepts.
type schema struct {
	what   string             // for messages: "a manifest", "build", ...
	fields map[string]*schema // keys of a mapping; nil for a scalar
	keys   []string           // the same keys in declaration order
	elem   *schema            // the items of a list
}

var manifestSchema = schemaOf(reflect.TypeFor[Manifest](), "a manifest")

func schemaOf(t reflect.Type, what string) *schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	s := &schema{what: what}
	switch t.Kind() {
	case reflect.Slice:
		s.elem = schemaOf(t.Elem(), what)
	case reflect.Struct:
		s.fields = map[string]*schema{}
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			s.fields[name] = schemaOf(f.Type, schemaWhat(f.Type, name))
			s.keys = append(s.keys, name)
		}
	}
	return s
}

func schemaWhat(t reflect.Type, key string) string {
	switch t {
	case reflect.TypeFor[*Build]():
		return "build"
	case reflect.TypeFor[[]Seat]():
		return "a seat"
	case reflect.TypeFor[[]Bucket]():
		return "a state entry"
	}
	return key
}

// walker records the line of every field of a manifest's syntax tree and
// refuses keys the schema does not have. With want set, it only looks for
// the field of that token instead.
type walker struct {
	file   string
	pos    positions
	probs  []Problem
	module string

	want  *token.Token
	found string
}

func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.TagNode:
			n = v.Value
		case *ast.AnchorNode:
			n = v.Value
		case *ast.CommentGroupNode:
			return nil
		default:
			if n == nil || reflect.ValueOf(n).IsNil() {
				return nil
			}
			return n
		}
	}
}

func (w *walker) at(path string, n ast.Node) {
	if n == nil {
		return
	}
	tok := n.GetToken()
	if w.want != nil {
		if tok == w.want {
			w.found = path
		}
		return
	}
	if l := tokenLine(tok); l > 0 {
		if _, ok := w.pos[path]; !ok {
			w.pos[path] = l
		}
	}
}

func (w *walker) walk(n ast.Node, path string, s *schema) {
	n = unwrap(n)
	if n == nil {
		return
	}
	w.at(path, n)
	switch v := n.(type) {
	case *ast.MappingNode:
		for _, kv := range v.Values {
			w.pair(kv, path, s)
		}
	case *ast.MappingValueNode:
		w.pair(v, path, s)
	case *ast.SequenceNode:
		var elem *schema
		if s != nil {
			elem = s.elem
		}
		for i, item := range v.Values {
			w.walk(item, path+"["+strconv.Itoa(i)+"]", elem)
		}
	}
}

func (w *walker) pair(kv *ast.MappingValueNode, path string, s *schema) {
	if kv.Key != nil && kv.Key.IsMergeKey() {
		w.walk(kv.Value, path, s)
		return
	}
	key := keyString(kv.Key)
	p := key
	if path != "" {
		p = path + "." + key
	}
	w.at(p, kv.Key)
	if path == "" && key == "module" {
		if sn, ok := unwrap(kv.Value).(*ast.StringNode); ok && ValidName(sn.Value) {
			w.module = sn.Value
		}
	}
	var child *schema
	if s != nil && s.fields != nil && w.want == nil {
		c, ok := s.fields[key]
		if !ok {
			w.probs = append(w.probs, Problem{File: w.file, Line: tokenLine(kv.Key.GetToken()), Field: p, Message: unknownKey(key, s)})
			return
		}
		child = c
	}
	w.walk(kv.Value, p, child)
}

func keyString(k ast.MapKeyNode) string {
	switch v := unwrap(k).(type) {
	case *ast.StringNode:
		return v.Value
	case ast.ScalarNode:
		return fmt.Sprint(v.GetValue())
	case nil:
		return ""
	default:
		return v.String()
	}
}

func unknownKey(key string, s *schema) string {
	keys := append([]string(nil), s.keys...)
	sort.Strings(keys)
	if near := nearest(key, keys); near != "" {
		return fmt.Sprintf("unknown key %q: write %q (the keys of %s are %s)", key, near, s.what, strings.Join(keys, ", "))
	}
	return fmt.Sprintf("unknown key %q: the keys of %s are %s", key, s.what, strings.Join(keys, ", "))
}

// nearest returns the candidate within a small edit distance of s, if any.
func nearest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(s), c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

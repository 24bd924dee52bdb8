package mesh

import (
	"math"
	"strconv"

	"github.com/goccy/go-yaml/ast"
)

// decodePlain decodes a plain manifest — mappings, lists, strings and whole
// numbers, as nearly every manifest is — straight from its syntax tree,
// which is several times faster than the reflective decoder and keeps a
// 10,000-module catalogue well inside a second. It gives up, returning
// false, on anything else: an anchor, alias, tag or merge key, or a value of
// another kind, or a key the schema does not have. Then goccy's strict
// decoder decodes the manifest and reports what is wrong.
// TestDecodePlainAgrees and FuzzDecodePlain keep the two decoders the same.
func decodePlain(n ast.Node, m *Manifest) bool {
	return eachPair(n, func(key string, v ast.Node) bool {
		switch key {
		case "module":
			return plainString(v, &m.Module)
		case "build":
			if _, null := v.(*ast.NullNode); null {
				return true
			}
			m.Build = new(Build)
			return decodeBuild(v, m.Build)
		case "seats":
			return plainList(v, &m.Seats, decodeSeat)
		case "holds":
			return plainStrings(v, &m.Holds)
		case "emits":
			return plainStrings(v, &m.Emits)
		case "consumes":
			return plainStrings(v, &m.Consumes)
		case "uses":
			return plainStrings(v, &m.Uses)
		case "serves":
			return plainStrings(v, &m.Serves)
		case "state":
			return plainList(v, &m.State, decodeBucket)
		case "reads":
			return plainStrings(v, &m.Reads)
		}
		return false // an unknown key: goccy's decoder has the last word
	})
}

func decodeBuild(n ast.Node, b *Build) bool {
	return eachPair(n, func(key string, v ast.Node) bool {
		switch key {
		case "repo":
			return plainString(v, &b.Repo)
		case "path":
			return plainString(v, &b.Path)
		case "dockerfile":
			return plainString(v, &b.Dockerfile)
		case "on":
			return plainStrings(v, &b.On)
		case "platforms":
			return plainStrings(v, &b.Platforms)
		}
		return false // an unknown key: goccy's decoder has the last word
	})
}

func decodeSeat(n ast.Node, s *Seat) bool {
	return eachPair(n, func(key string, v ast.Node) bool {
		switch key {
		case "seat":
			return plainString(v, &s.Seat)
		case "scope":
			return plainString(v, &s.Scope)
		case "accepts":
			return plainStrings(v, &s.Accepts)
		case "emits":
			return plainStrings(v, &s.Emits)
		case "serves":
			return plainStrings(v, &s.Serves)
		}
		return false // an unknown key: goccy's decoder has the last word
	})
}

func decodeBucket(n ast.Node, b *Bucket) bool {
	return eachPair(n, func(key string, v ast.Node) bool {
		switch key {
		case "name":
			return plainString(v, &b.Name)
		case "history":
			return plainInt(v, &b.History)
		case "ttl":
			return plainString(v, &b.TTL)
		}
		return false // an unknown key: goccy's decoder has the last word
	})
}

// eachPair calls f for every key of a plain mapping, until f returns false.
func eachPair(n ast.Node, f func(key string, v ast.Node) bool) bool {
	var pairs []*ast.MappingValueNode
	switch v := n.(type) {
	case *ast.MappingNode:
		pairs = v.Values
	case *ast.MappingValueNode:
		pairs = []*ast.MappingValueNode{v}
	default:
		return false
	}
	for _, kv := range pairs {
		k, ok := kv.Key.(*ast.StringNode)
		if !ok || kv.Value == nil {
			return false
		}
		if !f(k.Value, kv.Value) {
			return false
		}
	}
	return true
}

func plainString(n ast.Node, dst *string) bool {
	switch v := n.(type) {
	case *ast.StringNode:
		*dst = v.Value
	case *ast.NullNode:
		*dst = ""
	case *ast.IntegerNode:
		switch i := v.Value.(type) {
		case int64:
			*dst = strconv.FormatInt(i, 10)
		case uint64:
			*dst = strconv.FormatUint(i, 10)
		default:
			return false
		}
	default:
		return false
	}
	return true
}

func plainInt(n ast.Node, dst *int) bool {
	switch v := n.(type) {
	case *ast.IntegerNode:
		switch i := v.Value.(type) {
		case int64:
			*dst = int(i)
		case uint64:
			if i > math.MaxInt32 {
				return false // goccy's decoder says what is wrong
			}
			*dst = int(i)
		default:
			return false
		}
	case *ast.NullNode:
		*dst = 0
	default:
		return false
	}
	return true
}

func plainStrings(n ast.Node, dst *[]string) bool {
	return plainList(n, dst, plainString)
}

func plainList[T any](n ast.Node, dst *[]T, item func(ast.Node, *T) bool) bool {
	switch v := n.(type) {
	case *ast.SequenceNode:
		out := make([]T, len(v.Values))
		for i, e := range v.Values {
			if !item(e, &out[i]) {
				return false
			}
		}
		*dst = out
		return true
	case *ast.NullNode:
		*dst = nil
		return true
	}
	return false
}

package main

import (
	"encoding/json"

	"go.yaml.in/yaml/v3"
)

// omap is a YAML mapping that keeps its keys in the order written.
type omap []kv

type kv struct {
	key   string
	value any
}

func (m omap) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, f := range m {
		var k, v yaml.Node
		k.SetString(f.key)
		if err := v.Encode(f.value); err != nil {
			return nil, err
		}
		n.Content = append(n.Content, &k, &v)
	}
	return n, nil
}

// ref is a reference to another part of the document.
func ref(to string) omap { return omap{{"$ref", to}} }

// toNode is v as encoding/json writes it (in its order), as a YAML node.
func toNode(v any) (*yaml.Node, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	n := doc.Content[0]
	blockStyle(n)
	return n, nil
}

// blockStyle writes n and what it holds in YAML's block style, not as the
// JSON it was read from; a string stays plain where YAML allows.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

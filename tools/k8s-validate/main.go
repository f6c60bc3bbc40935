// k8s-validate: strict schema check of rendered Kubernetes manifests (helm template output on stdin)
// against the Kubernetes API's own Go types (k8s.io/api through client-go's scheme): an unknown or
// misspelt field, a wrong type or an unknown apiVersion/kind of a built-in resource is an error.
// Custom resources (KEDA, Prometheus Operator) are not in the scheme: their kinds are printed as
// "custom" for the caller to check. Exit status 1 on any error.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

func main() {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	failed := false
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: reading YAML: %v\n", err)
			os.Exit(1)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var meta typeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			fmt.Printf("error: %v\n", err)
			failed = true
			continue
		}
		if meta.APIVersion == "" && meta.Kind == "" {
			continue // a document of comments only
		}
		where := fmt.Sprintf("%s %s/%s", meta.APIVersion, meta.Kind, meta.Metadata.Name)
		json, err := yaml.YAMLToJSON(doc)
		if err != nil {
			fmt.Printf("error: %s: %v\n", where, err)
			failed = true
			continue
		}
		_, _, err = decoder.Decode(json, nil, nil)
		switch {
		case err == nil:
			fmt.Printf("ok: %s\n", where)
		case runtime.IsNotRegisteredError(err):
			fmt.Printf("custom: %s\n", where)
		default:
			fmt.Printf("error: %s: %v\n", where, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

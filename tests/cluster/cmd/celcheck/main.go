// Command celcheck is the reference side of dra-cel's differential test: it evaluates device
// selector expressions with the real Kubernetes implementation
// (k8s.io/dynamic-resource-allocation/cel) and prints one JSON result per case, so the Rust test
// can compare its own results with them case by case.
//
// Input (stdin), one JSON document:
//
//	{"listTypeAttributes": false,
//	 "devices": {"<name>": {"driver": "...", "allowMultipleAllocations": true,
//	                         "attributes": {"<qualified name>": {"int": 1}},
//	                         "capacity": {"<qualified name>": {"value": "1Gi"}}}},
//	 "cases": [{"expr": "...", "device": "<name>"}],
//	 "quantities": ["1.5Gi", ...]}
//
// Output (stdout), one JSON document:
//
//	{"cases": [{"result": true} | {"error": "...", "kind": "compile"|"runtime"}],
//	 "quantities": [{"canonical": "1536Mi"} | {"error": "..."}]}
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

type device struct {
	Driver                   string                                                   `json:"driver"`
	AllowMultipleAllocations *bool                                                    `json:"allowMultipleAllocations,omitempty"`
	Attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity  `json:"capacity"`
}

type input struct {
	ListTypeAttributes bool              `json:"listTypeAttributes"`
	Devices            map[string]device `json:"devices"`
	Cases              []struct {
		Expr   string `json:"expr"`
		Device string `json:"device"`
	} `json:"cases"`
	Quantities []string `json:"quantities"`
}

type caseResult struct {
	Result *bool  `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
	Kind   string `json:"kind,omitempty"`
}

type quantityResult struct {
	Canonical *string `json:"canonical,omitempty"`
	Error     string  `json:"error,omitempty"`
}

type output struct {
	Cases      []caseResult     `json:"cases"`
	Quantities []quantityResult `json:"quantities"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "celcheck: decoding input: %v\n", err)
		os.Exit(2)
	}
	compiler := dracel.GetCompiler(dracel.Features{
		EnableConsumableCapacity: true,
		EnableListTypeAttributes: in.ListTypeAttributes,
	})
	out := output{Cases: []caseResult{}, Quantities: []quantityResult{}}
	compiled := map[string]dracel.CompilationResult{}
	for _, c := range in.Cases {
		dev, ok := in.Devices[c.Device]
		if !ok {
			fmt.Fprintf(os.Stderr, "celcheck: unknown device %q\n", c.Device)
			os.Exit(2)
		}
		result, ok := compiled[c.Expr]
		if !ok {
			result = compiler.CompileCELExpression(c.Expr, dracel.Options{})
			compiled[c.Expr] = result
		}
		if result.Error != nil {
			out.Cases = append(out.Cases, caseResult{Error: result.Error.Error(), Kind: "compile"})
			continue
		}
		matches, _, err := result.DeviceMatches(context.Background(), dracel.Device{
			Driver:                   dev.Driver,
			AllowMultipleAllocations: dev.AllowMultipleAllocations,
			Attributes:               dev.Attributes,
			Capacity:                 dev.Capacity,
		})
		if err != nil {
			out.Cases = append(out.Cases, caseResult{Error: err.Error(), Kind: "runtime"})
			continue
		}
		out.Cases = append(out.Cases, caseResult{Result: &matches})
	}
	for _, s := range in.Quantities {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			out.Quantities = append(out.Quantities, quantityResult{Error: err.Error()})
			continue
		}
		// Drop the text Quantity remembers from parsing so String() computes the canonical form.
		q.Add(resource.Quantity{})
		canonical := q.String()
		out.Quantities = append(out.Quantities, quantityResult{Canonical: &canonical})
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "celcheck: encoding output: %v\n", err)
		os.Exit(2)
	}
}

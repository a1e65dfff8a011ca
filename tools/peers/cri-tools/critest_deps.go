//go:build tools

// Package critools records, for `go mod tidy`, the packages that critest's
// test binary imports: upstream's cmd/critest holds only a _test.go file, so
// neither a `tool` line nor a plain import can name it, and tidy would drop
// the modules `go test -c sigs.k8s.io/cri-tools/cmd/critest` needs.
// The `tools` build tag keeps this file out of every build.
package critools

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/ginkgo/v2/types"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/common"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
	_ "sigs.k8s.io/cri-tools/pkg/version"
)

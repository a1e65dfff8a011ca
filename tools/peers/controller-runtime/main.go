// podset-controller: the PodSet sample controller written with
// controller-runtime, the reference Petrel's controller kit is measured
// against (issue 30). It does what Petrel's sample under examples/ does:
// keeps spec.replicas Pods from spec.template, owned by the PodSet and
// labelled with its name, and writes status.replicas and
// status.observedGeneration; with leader election on a Lease.
//
// For the benchmark it prints one line per event on stdout, times in Unix
// nanoseconds on this machine's clock (the same protocol as Petrel's sample):
//
//	leading <t>                      this replica became the leader
//	first-reconcile <t>              its first reconcile after that
//	reconciled <ns>/<name> <g> <c> <t>
//	                                 a reconcile saw generation g whose user
//	                                 change was stamped c (the annotation
//	                                 bench.petrel.dev/changed-at); once per c
//	stopped-leading <t>              leadership lost or given up
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const (
	// The label that ties a Pod to its PodSet (by name; ownership by UID).
	podSetLabel = "bench.petrel.dev/podset"
	// The annotation a client stamps a user change with (Unix ns).
	changedAt = "bench.petrel.dev/changed-at"
)

func now() int64 { return time.Now().UnixNano() }

type reconciler struct {
	client.Client
	leading   atomic.Int64 // when this replica became leader (0: not yet)
	reported  atomic.Bool  // first-reconcile printed
	mu        sync.Mutex
	lastStamp map[string]string // namespace/name -> the last changed-at printed
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.leading.Load() != 0 && r.reported.CompareAndSwap(false, true) {
		fmt.Printf("first-reconcile %d\n", now())
	}
	var ps PodSet
	if err := r.Get(ctx, req.NamespacedName, &ps); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(req.Namespace), client.MatchingLabels{podSetLabel: req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	var owned []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && metav1.IsControlledBy(p, &ps) {
			owned = append(owned, p)
		}
	}
	want := int(ps.Spec.Replicas)
	for i := len(owned); i < want; i++ {
		if err := r.Create(ctx, r.newPod(&ps)); err != nil {
			return ctrl.Result{}, err
		}
	}
	for i := want; i < len(owned); i++ {
		if err := r.Delete(ctx, owned[i]); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
	}
	if ps.Status.Replicas != ps.Spec.Replicas || ps.Status.ObservedGeneration != ps.Generation {
		ps.Status.Replicas = ps.Spec.Replicas
		ps.Status.ObservedGeneration = ps.Generation
		if err := r.Status().Update(ctx, &ps); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{Requeue: true}, nil
			}
			return ctrl.Result{}, err
		}
	}
	r.report(&ps)
	return ctrl.Result{}, nil
}

// report prints the reconcile of a stamped user change, once per stamp.
func (r *reconciler) report(ps *PodSet) {
	stamp, ok := ps.Annotations[changedAt]
	if !ok {
		return
	}
	if _, err := strconv.ParseInt(stamp, 10, 64); err != nil {
		return
	}
	key := ps.Namespace + "/" + ps.Name
	r.mu.Lock()
	seen := r.lastStamp[key] == stamp
	r.lastStamp[key] = stamp
	r.mu.Unlock()
	if !seen {
		fmt.Printf("reconciled %s %d %s %d\n", key, ps.Generation, stamp, now())
	}
}

func (r *reconciler) newPod(ps *PodSet) *corev1.Pod {
	t := ps.Spec.Template.DeepCopy()
	pod := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Namespace = ps.Namespace
	pod.GenerateName = ps.Name + "-"
	pod.ResourceVersion = ""
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[podSetLabel] = ps.Name
	controllerRef := true
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: GroupVersion.String(), Kind: "PodSet", Name: ps.Name, UID: ps.UID,
		Controller: &controllerRef, BlockOwnerDeletion: &controllerRef,
	}}
	return pod
}

func main() {
	var (
		namespace     = flag.String("namespace", "", "watch only this namespace (all when empty)")
		leaderElect   = flag.Bool("leader-elect", false, "elect a leader on a Lease")
		leaseName     = flag.String("leader-election-id", "podset-controller", "the Lease's name")
		leaseNS       = flag.String("leader-election-namespace", "default", "the Lease's namespace")
		leaseDuration = flag.Duration("lease-duration", 15*time.Second, "Lease duration")
		renewDeadline = flag.Duration("renew-deadline", 10*time.Second, "renew deadline")
		retryPeriod   = flag.Duration("retry-period", 2*time.Second, "retry period")
		release       = flag.Bool("release-on-cancel", true, "give the Lease up on SIGTERM")
		syncPeriod    = flag.Duration("sync-period", 10*time.Hour, "the informers' resync period")
		workers       = flag.Int("workers", 1, "concurrent reconciles")
		metricsAddr   = flag.String("metrics-bind-address", "0", "metrics address (0: off)")
		probeAddr     = flag.String("health-probe-bind-address", "0", "readyz/healthz address (0: off)")
	)
	version := flag.Bool("version", false, "print the controller-runtime version compiled in and exit")
	flag.Parse()
	if *version {
		fmt.Println("podset-controller controller-runtime", moduleVersion("sigs.k8s.io/controller-runtime"))
		return
	}
	if err := run(*namespace, *leaderElect, *leaseName, *leaseNS,
		*leaseDuration, *renewDeadline, *retryPeriod, *release, *syncPeriod, *workers,
		*metricsAddr, *probeAddr); err != nil {
		fmt.Fprintf(os.Stderr, "podset-controller: %v\n", err)
		os.Exit(1)
	}
}

// moduleVersion is the version of module path compiled into this binary.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "unknown"
}

func run(namespace string, leaderElect bool, leaseName, leaseNS string,
	leaseDuration, renewDeadline, retryPeriod time.Duration, release bool, syncPeriod time.Duration,
	workers int, metricsAddr, probeAddr string) error {
	// --kubeconfig (controller-runtime registers the flag) or $KUBECONFIG.
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// The API server is local and the benchmark drives it hard: client-go's
	// default 5 QPS would measure the rate limiter, not the controller.
	cfg.QPS, cfg.Burst = 1000, 2000
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := addKnownTypes(scheme); err != nil {
		return err
	}
	// Neither sample reads managedFields: both caches drop them.
	cacheOpts := cache.Options{SyncPeriod: &syncPeriod, DefaultTransform: cache.TransformStripManagedFields()}
	if namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         cacheOpts,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              leaseName,
		LeaderElectionNamespace:       leaseNS,
		LeaderElectionReleaseOnCancel: release,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return fmt.Errorf("informers not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	r := &reconciler{Client: mgr.GetClient(), lastStamp: map[string]string{}}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&PodSet{}).
		Owns(&corev1.Pod{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	go func() {
		select {
		case <-mgr.Elected():
			r.leading.Store(now())
			fmt.Printf("leading %d\n", r.leading.Load())
		case <-ctx.Done():
		}
	}()
	err = mgr.Start(ctx)
	if r.leading.Load() != 0 {
		fmt.Printf("stopped-leading %d\n", now())
	}
	return err
}

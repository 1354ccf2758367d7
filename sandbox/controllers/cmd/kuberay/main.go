// Command kuberay runs KubeRay's RayCluster, RayJob and RayService
// reconcilers (github.com/ray-project/kuberay/ray-operator, the version
// go.mod pins) for the sandbox.
//
// Why not KubeRay's own main package: it imports KubeRay's webhook package,
// written for controller-runtime v0.22, whose webhook builder changed
// signature in v0.23; this module shares one controller-runtime (v0.24,
// which JobSet, LWS and Trainer require) with the other controllers. The
// webhooks are off in KubeRay's default install (ENABLE_WEBHOOKS unset), so
// this main sets up the same reconcilers without them, with the options of
// that install: all namespaces, the Job cache limited to the Jobs KubeRay
// creates, no batch scheduler, metrics and leader election as flagged.
package main

import (
	"flag"
	"os"

	routev1 "github.com/openshift/api/route/v1"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configapi "github.com/ray-project/kuberay/ray-operator/apis/config/v1alpha1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/batchscheduler"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
)

var setupLog = ctrl.Log.WithName("setup")

func main() {
	probeAddr := flag.String("health-probe-bind-address", configapi.DefaultProbeAddr,
		"The address the probe endpoint binds to.")
	metricsAddr := flag.String("metrics-addr", "0", `The metrics endpoint's address ("0": off).`)
	leaderElect := flag.Bool("enable-leader-election", false, "Elect a leader among replicas.")
	concurrency := flag.Int("reconcile-concurrency", configapi.DefaultReconcileConcurrency,
		"Reconciles at once per kind.")
	logOptions := zap.Options{}
	logOptions.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOptions)))

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(rayv1.AddToScheme(scheme))
	utilruntime.Must(routev1.Install(scheme))
	utilruntime.Must(batchv1.AddToScheme(scheme))

	// KubeRay reads back only the submitter Jobs it labels as its own.
	created, err := labels.Parse(utils.KubernetesCreatedByLabelKey + "=" + utils.ComponentName)
	exitOnError(err, "job cache selector")
	restConfig := ctrl.GetConfigOrDie()
	restConfig.UserAgent = "kuberay-operator/" + utils.KUBERAY_VERSION
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cache.Options{ByObject: map[client.Object]cache.ByObject{&batchv1.Job{}: {Label: created}}},
		Metrics:                metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress: *probeAddr,
		LeaderElection:         *leaderElect,
		LeaderElectionID:       "ray-operator-leader",
	})
	exitOnError(err, "unable to start manager")

	ctx := ctrl.SetupSignalHandler()
	config := configapi.Configuration{}
	schedulers, err := batchscheduler.NewSchedulerManager(ctx, config, restConfig, mgr.GetClient())
	exitOnError(err, "unable to create batch scheduler manager")
	schedulers.AddToScheme(mgr.GetScheme())

	exitOnError(ray.NewReconciler(ctx, mgr, ray.RayClusterReconcilerOptions{
		BatchSchedulerManager: schedulers, IsOpenShift: utils.GetClusterType(),
	}).SetupWithManager(mgr, *concurrency), "unable to create controller", "controller", "RayCluster")
	exitOnError(ray.NewRayServiceReconciler(ctx, mgr, config).SetupWithManager(mgr, *concurrency),
		"unable to create controller", "controller", "RayService")
	exitOnError(ray.NewRayJobReconciler(ctx, mgr, ray.RayJobReconcilerOptions{
		BatchSchedulerManager: schedulers,
	}, config).SetupWithManager(mgr, *concurrency), "unable to create controller", "controller", "RayJob")

	exitOnError(mgr.AddHealthzCheck("healthz", healthz.Ping), "unable to set up health check")
	exitOnError(mgr.AddReadyzCheck("readyz", healthz.Ping), "unable to set up ready check")
	setupLog.Info("starting manager", "version", utils.KUBERAY_VERSION)
	exitOnError(mgr.Start(ctx), "problem running manager")
}

func exitOnError(err error, msg string, keysAndValues ...any) {
	if err != nil {
		setupLog.Error(err, msg, keysAndValues...)
		os.Exit(1)
	}
}

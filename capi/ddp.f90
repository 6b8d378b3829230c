! The runtime for Fortran programs: a module over the C API (ddp_c.h) with iso_c_binding. Compile this file with
! the program (gfortran or mpifort; a .mod file is specific to the compiler's version) and link libddp.
!
!   use ddp
!   call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)     ! the application owns MPI
!   status = ddp_session_create(comm, "auto", session)            ! comm: an integer communicator (or %MPI_VAL)
!   status = ddp_mlp_create(session, [2_int64, 64_int64, 1_int64], "tanh", 0_int64, model)
!   ! or any model of the runtime's layers from its JSON description, with weights trained in PyTorch:
!   status = ddp_model_create_from_json(session, '{"inputs": 2, "layers": [...]}', 0_int64, model)
!   status = ddp_model_load_weights(model, "offline.safetensors")
!   status = ddp_model_distribute(model)
!   status = ddp_optimizer_create_adamw(model, 1d-3, 0d0, optimizer)
!   status = ddp_train_step(model, optimizer, x, y, loss)          ! x(2, batch), y(1, batch): real(c_float)
!   status = ddp_replay_buffer_create(session, 4096_int64, 2_int64, 1_int64, 0_int64, buffer)
!   status = ddp_replay_buffer_add(buffer, x, y)                   ! samples in as the simulation makes them
!   status = ddp_train_step_replay(model, optimizer, buffer, 64_int64, loss)
!   status = ddp_predict(model, x, prediction)
!   if (status /= DDP_OK) print *, trim(ddp_last_error())
!
! Every function returns the C API's status (DDP_OK = 0); arrays are column-major x(features, samples), which is
! the C API's row-major samples x features, passed in place (no copy). ddp_c.h states the rules.
module ddp
  use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr, c_int, c_int64_t, c_double, c_float, c_char, &
      c_null_char, c_loc, c_associated
  implicit none
  private

  integer, parameter, public :: DDP_OK = 0, DDP_ERROR_INVALID_ARGUMENT = 1, DDP_ERROR_INVALID_HANDLE = 2, &
      DDP_ERROR_MPI = 3, DDP_ERROR_COLLECTIVE = 4, DDP_ERROR_OUT_OF_MEMORY = 5, DDP_ERROR_RUNTIME = 6, &
      DDP_ERROR_INTERNAL = 7
  integer, parameter, public :: DDP_MEMORY_HOST = 0, DDP_MEMORY_DEVICE = 1
  integer, parameter, public :: DDP_NONFINITE_REFUSE = 0, DDP_NONFINITE_SKIP = 1

  type, public :: ddp_session
    type(c_ptr) :: handle = c_null_ptr
  end type
  type, public :: ddp_model
    type(c_ptr) :: handle = c_null_ptr
  end type
  type, public :: ddp_optimizer
    type(c_ptr) :: handle = c_null_ptr
  end type
  type, public :: ddp_replay_buffer
    type(c_ptr) :: handle = c_null_ptr
  end type

  public :: ddp_last_error, ddp_session_create, ddp_session_rank, ddp_session_size, ddp_session_mean, &
      ddp_session_destroy, ddp_mlp_create, ddp_model_distribute, ddp_model_destroy, ddp_optimizer_create_adamw, &
      ddp_optimizer_create_sgd, ddp_optimizer_set_lr, ddp_optimizer_destroy, ddp_train_step, ddp_predict, &
      ddp_checkpoint_save, ddp_checkpoint_load, ddp_replay_buffer_create, ddp_replay_buffer_add, &
      ddp_replay_buffer_size, ddp_replay_buffer_destroy, ddp_train_step_replay
  public :: ddp_model_create_from_json, ddp_model_load_weights, ddp_model_save_weights, ddp_model_input_size, &
      ddp_model_output_size
  public :: ddp_model_set_nonfinite, ddp_model_nonfinite_skipped, ddp_replay_buffer_set_nonfinite, &
      ddp_replay_buffer_nonfinite_skipped
  public :: ddp_train_step_async, ddp_session_synchronize

  interface
    subroutine c_last_error_copy(buffer, size) bind(C, name="ddp_last_error_copy")
      import :: c_char, c_int64_t
      character(kind=c_char), intent(out) :: buffer(*)
      integer(c_int64_t), value :: size
    end subroutine
    integer(c_int) function c_session_create_f(comm, device, out) bind(C, name="ddp_session_create_f")
      import :: c_int, c_char, c_ptr
      integer(c_int), value :: comm
      character(kind=c_char), intent(in) :: device(*)
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_session_rank(session, rank) bind(C, name="ddp_session_rank")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      integer(c_int), intent(out) :: rank
    end function
    integer(c_int) function c_session_size(session, size) bind(C, name="ddp_session_size")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      integer(c_int), intent(out) :: size
    end function
    integer(c_int) function c_session_mean(session, value, mean) bind(C, name="ddp_session_mean")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: session
      real(c_double), value :: value
      real(c_double), intent(out) :: mean
    end function
    integer(c_int) function c_session_synchronize(session) bind(C, name="ddp_session_synchronize")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
    end function
    integer(c_int) function c_session_destroy(session) bind(C, name="ddp_session_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
    end function
    integer(c_int) function c_mlp_create(session, count, sizes, activation, seed, out) bind(C, name="ddp_mlp_create")
      import :: c_int, c_ptr, c_int64_t, c_char
      type(c_ptr), value :: session
      integer(c_int), value :: count
      integer(c_int64_t), intent(in) :: sizes(*)
      character(kind=c_char), intent(in) :: activation(*)
      integer(c_int64_t), value :: seed
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_model_create_from_json(session, json, seed, out) &
        bind(C, name="ddp_model_create_from_json")
      import :: c_int, c_ptr, c_int64_t, c_char
      type(c_ptr), value :: session
      character(kind=c_char), intent(in) :: json(*)
      integer(c_int64_t), value :: seed
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_model_load_weights(model, path) bind(C, name="ddp_model_load_weights")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: model
      character(kind=c_char), intent(in) :: path(*)
    end function
    integer(c_int) function c_model_save_weights(model, path) bind(C, name="ddp_model_save_weights")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: model
      character(kind=c_char), intent(in) :: path(*)
    end function
    integer(c_int) function c_model_input_size(model, size) bind(C, name="ddp_model_input_size")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model
      integer(c_int64_t), intent(out) :: size
    end function
    integer(c_int) function c_model_output_size(model, size) bind(C, name="ddp_model_output_size")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model
      integer(c_int64_t), intent(out) :: size
    end function
    integer(c_int) function c_model_distribute(model) bind(C, name="ddp_model_distribute")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
    end function
    integer(c_int) function c_model_destroy(model) bind(C, name="ddp_model_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
    end function
    integer(c_int) function c_optimizer_create_adamw(model, lr, weight_decay, out) &
        bind(C, name="ddp_optimizer_create_adamw")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: model
      real(c_double), value :: lr, weight_decay
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_optimizer_create_sgd(model, lr, momentum, out) bind(C, name="ddp_optimizer_create_sgd")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: model
      real(c_double), value :: lr, momentum
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_optimizer_set_lr(optimizer, lr) bind(C, name="ddp_optimizer_set_lr")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: optimizer
      real(c_double), value :: lr
    end function
    integer(c_int) function c_optimizer_destroy(optimizer) bind(C, name="ddp_optimizer_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: optimizer
    end function
    integer(c_int) function c_train_step_async(model, optimizer, x, x_rows, x_cols, y, y_rows, y_cols, memory) &
        bind(C, name="ddp_train_step_async")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model, optimizer, x, y
      integer(c_int64_t), value :: x_rows, x_cols, y_rows, y_cols
      integer(c_int), value :: memory
    end function
    integer(c_int) function c_train_step(model, optimizer, x, x_rows, x_cols, y, y_rows, y_cols, memory, loss) &
        bind(C, name="ddp_train_step")
      import :: c_int, c_ptr, c_int64_t, c_double
      type(c_ptr), value :: model, optimizer, x, y
      integer(c_int64_t), value :: x_rows, x_cols, y_rows, y_cols
      integer(c_int), value :: memory
      real(c_double), intent(out) :: loss
    end function
    integer(c_int) function c_predict(model, x, x_rows, x_cols, memory, y, y_rows, y_cols) bind(C, name="ddp_predict")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model, x, y
      integer(c_int64_t), value :: x_rows, x_cols, y_rows, y_cols
      integer(c_int), value :: memory
    end function
    integer(c_int) function c_replay_buffer_create(session, capacity, inputs, targets, seed, out) &
        bind(C, name="ddp_replay_buffer_create")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: session
      integer(c_int64_t), value :: capacity, inputs, targets, seed
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_replay_buffer_add(buffer, x, x_rows, x_cols, y, y_rows, y_cols, memory) &
        bind(C, name="ddp_replay_buffer_add")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: buffer, x, y
      integer(c_int64_t), value :: x_rows, x_cols, y_rows, y_cols
      integer(c_int), value :: memory
    end function
    integer(c_int) function c_replay_buffer_size(buffer, size, added) bind(C, name="ddp_replay_buffer_size")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: buffer
      integer(c_int64_t), intent(out) :: size, added
    end function
    integer(c_int) function c_model_set_nonfinite(model, policy) bind(C, name="ddp_model_set_nonfinite")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
      integer(c_int), value :: policy
    end function
    integer(c_int) function c_model_nonfinite_skipped(model, skipped) bind(C, name="ddp_model_nonfinite_skipped")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model
      integer(c_int64_t), intent(out) :: skipped
    end function
    integer(c_int) function c_replay_buffer_set_nonfinite(buffer, policy) &
        bind(C, name="ddp_replay_buffer_set_nonfinite")
      import :: c_int, c_ptr
      type(c_ptr), value :: buffer
      integer(c_int), value :: policy
    end function
    integer(c_int) function c_replay_buffer_nonfinite_skipped(buffer, skipped) &
        bind(C, name="ddp_replay_buffer_nonfinite_skipped")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: buffer
      integer(c_int64_t), intent(out) :: skipped
    end function
    integer(c_int) function c_replay_buffer_destroy(buffer) bind(C, name="ddp_replay_buffer_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: buffer
    end function
    integer(c_int) function c_train_step_replay(model, optimizer, buffer, batch, loss) &
        bind(C, name="ddp_train_step_replay")
      import :: c_int, c_ptr, c_int64_t, c_double
      type(c_ptr), value :: model, optimizer, buffer
      integer(c_int64_t), value :: batch
      real(c_double), intent(out) :: loss
    end function
    integer(c_int) function c_checkpoint_save(model, optimizer, dir, step) bind(C, name="ddp_checkpoint_save")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: model, optimizer
      character(kind=c_char), intent(in) :: dir(*)
      integer(c_int64_t), value :: step
    end function
    integer(c_int) function c_checkpoint_load(model, optimizer, dir, step) bind(C, name="ddp_checkpoint_load")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: model, optimizer
      character(kind=c_char), intent(in) :: dir(*)
      integer(c_int64_t), intent(out) :: step
    end function
  end interface

contains

  ! The message of this thread's last failed call, "" if none failed.
  function ddp_last_error() result(message)
    character(len=:), allocatable :: message
    character(kind=c_char) :: buffer(2048)
    integer :: n
    call c_last_error_copy(buffer, int(size(buffer), c_int64_t))
    n = 0
    do while (n < size(buffer))
      if (buffer(n + 1) == c_null_char) exit
      n = n + 1
    end do
    allocate(character(len=n) :: message)
    message = transfer(buffer(1:n), message)
  end function

  ! comm: the application's communicator as Fortran sees it (an integer; with the mpi_f08 module, comm%MPI_VAL).
  integer function ddp_session_create(comm, device, session) result(status)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: device
    type(ddp_session), intent(out) :: session
    status = c_session_create_f(int(comm, c_int), device // c_null_char, session%handle)
  end function

  integer function ddp_session_rank(session, rank) result(status)
    type(ddp_session), intent(in) :: session
    integer, intent(out) :: rank
    integer(c_int) :: r
    r = -1
    status = c_session_rank(session%handle, r)
    rank = r
  end function

  integer function ddp_session_size(session, size) result(status)
    type(ddp_session), intent(in) :: session
    integer, intent(out) :: size
    integer(c_int) :: s
    s = 0
    status = c_session_size(session%handle, s)
    size = s
  end function

  integer function ddp_session_mean(session, value, mean) result(status)
    type(ddp_session), intent(in) :: session
    real(c_double), intent(in) :: value
    real(c_double), intent(out) :: mean
    status = c_session_mean(session%handle, value, mean)
  end function

  ! Waits for the session's queued work (the steps of ddp_train_step_async).
  integer function ddp_session_synchronize(session) result(status)
    type(ddp_session), intent(in) :: session
    status = c_session_synchronize(session%handle)
  end function

  integer function ddp_session_destroy(session) result(status)
    type(ddp_session), intent(inout) :: session
    status = c_session_destroy(session%handle)
    if (status == DDP_OK) session%handle = c_null_ptr
  end function

  integer function ddp_mlp_create(session, sizes, activation, seed, model) result(status)
    type(ddp_session), intent(in) :: session
    integer(c_int64_t), intent(in) :: sizes(:)
    character(len=*), intent(in) :: activation
    integer(c_int64_t), intent(in) :: seed
    type(ddp_model), intent(out) :: model
    status = c_mlp_create(session%handle, int(size(sizes), c_int), sizes, activation // c_null_char, seed, &
        model%handle)
  end function

  ! A model from a JSON description of its layers (ddp_c.h's ddp_model_create_from_json says the format).
  integer function ddp_model_create_from_json(session, json, seed, model) result(status)
    type(ddp_session), intent(in) :: session
    character(len=*), intent(in) :: json
    integer(c_int64_t), intent(in) :: seed
    type(ddp_model), intent(out) :: model
    status = c_model_create_from_json(session%handle, json // c_null_char, seed, model%handle)
  end function

  ! The model's weights from a safetensors file of PyTorch's state_dict (ddp_c.h says when it is collective).
  integer function ddp_model_load_weights(model, path) result(status)
    type(ddp_model), intent(in) :: model
    character(len=*), intent(in) :: path
    status = c_model_load_weights(model%handle, path // c_null_char)
  end function

  ! The model's weights to a safetensors file PyTorch loads, written atomically.
  integer function ddp_model_save_weights(model, path) result(status)
    type(ddp_model), intent(in) :: model
    character(len=*), intent(in) :: path
    status = c_model_save_weights(model%handle, path // c_null_char)
  end function

  ! The model's input and output widths (of a model from a description: its "inputs" and its last width).
  integer function ddp_model_input_size(model, size) result(status)
    type(ddp_model), intent(in) :: model
    integer(c_int64_t), intent(out) :: size
    status = c_model_input_size(model%handle, size)
  end function

  integer function ddp_model_output_size(model, size) result(status)
    type(ddp_model), intent(in) :: model
    integer(c_int64_t), intent(out) :: size
    status = c_model_output_size(model%handle, size)
  end function

  integer function ddp_model_distribute(model) result(status)
    type(ddp_model), intent(in) :: model
    status = c_model_distribute(model%handle)
  end function

  integer function ddp_model_destroy(model) result(status)
    type(ddp_model), intent(inout) :: model
    status = c_model_destroy(model%handle)
    if (status == DDP_OK) model%handle = c_null_ptr
  end function

  integer function ddp_optimizer_create_adamw(model, lr, weight_decay, optimizer) result(status)
    type(ddp_model), intent(in) :: model
    real(c_double), intent(in) :: lr, weight_decay
    type(ddp_optimizer), intent(out) :: optimizer
    status = c_optimizer_create_adamw(model%handle, lr, weight_decay, optimizer%handle)
  end function

  integer function ddp_optimizer_create_sgd(model, lr, momentum, optimizer) result(status)
    type(ddp_model), intent(in) :: model
    real(c_double), intent(in) :: lr, momentum
    type(ddp_optimizer), intent(out) :: optimizer
    status = c_optimizer_create_sgd(model%handle, lr, momentum, optimizer%handle)
  end function

  integer function ddp_optimizer_set_lr(optimizer, lr) result(status)
    type(ddp_optimizer), intent(in) :: optimizer
    real(c_double), intent(in) :: lr
    status = c_optimizer_set_lr(optimizer%handle, lr)
  end function

  integer function ddp_optimizer_destroy(optimizer) result(status)
    type(ddp_optimizer), intent(inout) :: optimizer
    status = c_optimizer_destroy(optimizer%handle)
    if (status == DDP_OK) optimizer%handle = c_null_ptr
  end function

  ! x(input_size, samples), y(output_size, samples): host arrays, read in place.
  integer function ddp_train_step(model, optimizer, x, y, loss) result(status)
    type(ddp_model), intent(in) :: model
    type(ddp_optimizer), intent(in) :: optimizer
    real(c_float), intent(in), target, contiguous :: x(:, :), y(:, :)
    real(c_double), intent(out) :: loss
    status = c_train_step(model%handle, optimizer%handle, c_loc(x), int(size(x, 2), c_int64_t), &
        int(size(x, 1), c_int64_t), c_loc(y), int(size(y, 2), c_int64_t), int(size(y, 1), c_int64_t), &
        int(DDP_MEMORY_HOST, c_int), loss)
  end function

  ! ddp_train_step without waiting for the step: x and y are copied before it returns (the arrays may be reused),
  ! the step runs on the session's GPU while the program goes on; ddp_session_synchronize waits for it.
  integer function ddp_train_step_async(model, optimizer, x, y) result(status)
    type(ddp_model), intent(in) :: model
    type(ddp_optimizer), intent(in) :: optimizer
    real(c_float), intent(in), target, contiguous :: x(:, :), y(:, :)
    status = c_train_step_async(model%handle, optimizer%handle, c_loc(x), int(size(x, 2), c_int64_t), &
        int(size(x, 1), c_int64_t), c_loc(y), int(size(y, 2), c_int64_t), int(size(y, 1), c_int64_t), &
        int(DDP_MEMORY_HOST, c_int))
  end function

  ! What ddp_train_step does with samples holding a NaN or an infinity: DDP_NONFINITE_REFUSE (the default) or
  ! DDP_NONFINITE_SKIP (left out, and counted by ddp_model_nonfinite_skipped).
  integer function ddp_model_set_nonfinite(model, policy) result(status)
    type(ddp_model), intent(in) :: model
    integer, intent(in) :: policy
    status = c_model_set_nonfinite(model%handle, int(policy, c_int))
  end function

  integer function ddp_model_nonfinite_skipped(model, skipped) result(status)
    type(ddp_model), intent(in) :: model
    integer(c_int64_t), intent(out) :: skipped
    status = c_model_nonfinite_skipped(model%handle, skipped)
  end function

  ! y(output_size, samples) = model(x(input_size, samples)).
  integer function ddp_predict(model, x, y) result(status)
    type(ddp_model), intent(in) :: model
    real(c_float), intent(in), target, contiguous :: x(:, :)
    real(c_float), intent(inout), target, contiguous :: y(:, :)
    status = c_predict(model%handle, c_loc(x), int(size(x, 2), c_int64_t), int(size(x, 1), c_int64_t), &
        int(DDP_MEMORY_HOST, c_int), c_loc(y), int(size(y, 2), c_int64_t), int(size(y, 1), c_int64_t))
  end function

  ! A replay buffer of `capacity` samples, held on the session's device; ddp_c.h states how batches are drawn.
  integer function ddp_replay_buffer_create(session, capacity, inputs, targets, seed, buffer) result(status)
    type(ddp_session), intent(in) :: session
    integer(c_int64_t), intent(in) :: capacity, inputs, targets, seed
    type(ddp_replay_buffer), intent(out) :: buffer
    status = c_replay_buffer_create(session%handle, capacity, inputs, targets, seed, buffer%handle)
  end function

  ! x(inputs, samples), y(targets, samples): host arrays, copied in before the function returns.
  integer function ddp_replay_buffer_add(buffer, x, y) result(status)
    type(ddp_replay_buffer), intent(in) :: buffer
    real(c_float), intent(in), target, contiguous :: x(:, :), y(:, :)
    status = c_replay_buffer_add(buffer%handle, c_loc(x), int(size(x, 2), c_int64_t), int(size(x, 1), c_int64_t), &
        c_loc(y), int(size(y, 2), c_int64_t), int(size(y, 1), c_int64_t), int(DDP_MEMORY_HOST, c_int))
  end function

  ! The same for ddp_replay_buffer_add (skipped samples are counted by ddp_replay_buffer_nonfinite_skipped).
  integer function ddp_replay_buffer_set_nonfinite(buffer, policy) result(status)
    type(ddp_replay_buffer), intent(in) :: buffer
    integer, intent(in) :: policy
    status = c_replay_buffer_set_nonfinite(buffer%handle, int(policy, c_int))
  end function

  integer function ddp_replay_buffer_nonfinite_skipped(buffer, skipped) result(status)
    type(ddp_replay_buffer), intent(in) :: buffer
    integer(c_int64_t), intent(out) :: skipped
    status = c_replay_buffer_nonfinite_skipped(buffer%handle, skipped)
  end function

  ! Samples held (at most the capacity) and ever added.
  integer function ddp_replay_buffer_size(buffer, size, added) result(status)
    type(ddp_replay_buffer), intent(in) :: buffer
    integer(c_int64_t), intent(out) :: size, added
    status = c_replay_buffer_size(buffer%handle, size, added)
  end function

  integer function ddp_replay_buffer_destroy(buffer) result(status)
    type(ddp_replay_buffer), intent(inout) :: buffer
    status = c_replay_buffer_destroy(buffer%handle)
    if (status == DDP_OK) buffer%handle = c_null_ptr
  end function

  ! One step as ddp_train_step on `batch` samples drawn from the buffer.
  integer function ddp_train_step_replay(model, optimizer, buffer, batch, loss) result(status)
    type(ddp_model), intent(in) :: model
    type(ddp_optimizer), intent(in) :: optimizer
    type(ddp_replay_buffer), intent(in) :: buffer
    integer(c_int64_t), intent(in) :: batch
    real(c_double), intent(out) :: loss
    status = c_train_step_replay(model%handle, optimizer%handle, buffer%handle, batch, loss)
  end function

  integer function ddp_checkpoint_save(model, optimizer, dir, step) result(status)
    type(ddp_model), intent(in) :: model
    type(ddp_optimizer), intent(in) :: optimizer
    character(len=*), intent(in) :: dir
    integer(c_int64_t), intent(in) :: step
    status = c_checkpoint_save(model%handle, optimizer%handle, dir // c_null_char, step)
  end function

  integer function ddp_checkpoint_load(model, optimizer, dir, step) result(status)
    type(ddp_model), intent(in) :: model
    type(ddp_optimizer), intent(in) :: optimizer
    character(len=*), intent(in) :: dir
    integer(c_int64_t), intent(out) :: step
    status = c_checkpoint_load(model%handle, optimizer%handle, dir // c_null_char, step)
  end function

end module ddp
